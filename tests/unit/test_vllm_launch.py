"""rollout/vllm_launch.py without a server: where vLLM is looked for, the command and environment of `vllm serve`
(the real server runs in tests/real_vllm)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trl_thundersync.errors import ConfigurationError, RolloutError
from trl_thundersync.rollout.vllm_launch import (
    ENV_PYTHON,
    VLLMInstall,
    VLLMServerProcess,
    find_vllm,
    serve_command,
    serve_environment,
)

CPU = VLLMInstall(python=Path("/venv/bin/python"), cpu=True)
GPU = VLLMInstall(python=Path("/venv/bin/python"), cpu=False)


def test_the_serve_command_carries_the_flags_our_client_and_publishers_need():
    argv = serve_command(CPU, "/m", port=8123)
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(argv)
    for flag in ("--model /m", "--port 8123", "--dtype float32", "--max-model-len 1024",
                 "--logprobs-mode processed_logprobs", "--enable-lora", "--max-lora-rank 16"):
        assert flag in joined, flag
    assert "--enable-lora" not in serve_command(CPU, "/m", port=1, enable_lora=False)


def test_trls_launcher_runs_trl_vllm_serve_from_the_same_install():
    argv = serve_command(CPU, "/m", port=8123, launcher="trl")
    assert argv[:2] == ["/venv/bin/trl", "vllm-serve"] and "--max_model_len" in argv and "--enable-lora" in argv
    with pytest.raises(ConfigurationError, match="launcher='sglang'"):
        serve_command(CPU, "/m", port=1, launcher="sglang")


def test_the_cpu_build_gets_a_bounded_kv_cache_and_dev_mode():
    env = serve_environment(CPU, kv_cache_gib=2, base={})
    assert env == {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
                   "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_CI_ENV": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    assert "VLLM_CPU_KVCACHE_SPACE" not in serve_environment(GPU, base={})


def test_an_interpreter_named_explicitly_must_import_vllm(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_PYTHON, raising=False)
    with pytest.raises(ConfigurationError, match="cannot import vllm"):
        find_vllm(sys.executable)  # the project venv has no vLLM
    monkeypatch.setenv(ENV_PYTHON, sys.executable)
    with pytest.raises(ConfigurationError, match=ENV_PYTHON):
        find_vllm()
    monkeypatch.delenv(ENV_PYTHON)
    assert find_vllm(search_from=tmp_path) is None  # no .venv-vllm in tmp_path or above it


@pytest.mark.spawn
def test_a_server_that_exits_before_it_is_ready_reports_its_log(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'RuntimeError: no such model' >&2\nexit 3\n")
    fake.chmod(0o755)
    server = VLLMServerProcess(VLLMInstall(python=fake, cpu=True), "/nowhere", port=1, startup_timeout=30,
                               log_path=tmp_path / "server.log")
    with pytest.raises(RolloutError, match="exited with code 3 before it was ready(.|\n)*no such model"):
        server.start()
