"""rollout/vllm_launch.py without a server: where vLLM is looked for, the command and environment of `vllm serve`
(the real server runs in tests/real_vllm)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.fake_vllm import fake_vllm_install
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
    # vLLM 0.32's CPU runner kills its engine when it prefills a seeded request in chunks: whole prefills on a CPU
    assert "--no-enable-chunked-prefill --max-num-batched-tokens 2048" in joined
    assert "--max-num-batched-tokens 4096" in " ".join(serve_command(CPU, "/m", port=1, max_model_len=4096))
    assert "chunked" not in " ".join(serve_command(GPU, "/m", port=1))


def test_trls_launcher_runs_trl_vllm_serve_from_the_same_install():
    argv = serve_command(CPU, "/m", port=8123, launcher="trl")
    assert argv[:2] == ["/venv/bin/trl", "vllm-serve"] and "--max_model_len" in argv and "--enable-lora" in argv
    with pytest.raises(ConfigurationError, match="launcher='sglang'"):
        serve_command(CPU, "/m", port=1, launcher="sglang")


def test_the_cpu_build_gets_a_bounded_kv_cache_and_dev_mode():
    env = serve_environment(CPU, base={"VLLM_CPU_KVCACHE_SPACE": "40"})  # a user's legacy setting would override
    assert env == {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
                   "VLLM_CPU_CI_ENV": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    assert serve_environment(CPU, base={}, kv_cache_env_gib=2)["VLLM_CPU_KVCACHE_SPACE"] == "2"  # trl vllm-serve
    argv = " ".join(serve_command(CPU, "/m", port=1, kv_cache_gib=0.5))
    assert f"--kv-cache-memory-bytes {1 << 29}" in argv  # fractions of a GiB, which the variable cannot say
    gpu = " ".join(serve_command(GPU, "/m", port=1, gpu_memory_utilization=0.3, max_model_len=None))
    assert "--gpu-memory-utilization 0.3" in gpu and "--max-model-len" not in gpu  # None: the model's own length


def test_an_installation_is_named_by_its_venv_its_interpreter_or_its_vllm_command(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_PYTHON, raising=False)
    monkeypatch.delenv("THUNDERSYNC_VLLM", raising=False)  # tests/conftest.py turns the automatic search off
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = fake_vllm_install(venv / "bin")
    assert find_vllm(venv).python == fake.python and find_vllm(venv).cpu
    assert find_vllm(fake.python).python == fake.python
    script = venv / "bin" / "vllm"  # a pip console script, and pip's /bin/sh trampoline for long paths
    script.write_text(f"#!{fake.python}\nimport sys\n")
    script.chmod(0o755)
    assert find_vllm(script).python == fake.python
    script.write_text("#!/bin/sh\n'''exec' \"" + str(fake.python) + "\" \"$0\" \"$@\"\n' '''\n")
    assert find_vllm(script).python == fake.python
    monkeypatch.setenv("PATH", f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert find_vllm("vllm").python == fake.python
    (tmp_path / "work" / ".venv-vllm" / "bin").mkdir(parents=True)
    fake_vllm_install(tmp_path / "work" / ".venv-vllm" / "bin")
    assert find_vllm(search_from=tmp_path / "work") is not None
    monkeypatch.setenv("THUNDERSYNC_VLLM", "0")  # as for setup_vllm.sh: no automatic search
    assert find_vllm(search_from=tmp_path / "work") is None
    assert find_vllm(venv) is not None  # a named installation still counts


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


@pytest.mark.spawn
def test_a_taken_port_is_retried_on_another_and_a_full_cache_names_the_setting(tmp_path):
    install = fake_vllm_install(tmp_path)
    server = VLLMServerProcess(install, tmp_path / "port-taken-once", port=0, startup_timeout=60,
                               log_path=tmp_path / "once.log")
    with server:
        assert server.alive() and server.port != 0
    server = VLLMServerProcess(install, tmp_path / "port-taken", port=0, startup_timeout=60,
                               log_path=tmp_path / "taken.log")
    with pytest.raises(RolloutError, match=r"could not bind its port \(3 free ports tried\)"):
        server.start()
    server = VLLMServerProcess(install, tmp_path / "cache", port=0, startup_timeout=60, log_path=tmp_path / "c.log",
                               kv_cache_setting="rollout_vllm_kv_cache_gib")
    with pytest.raises(RolloutError, match="exited with code 1 .*KV cache: raise or lower rollout_vllm_kv_cache_gib"):
        server.start()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"  # exited, not reaped yet


@pytest.mark.spawn
def test_the_server_and_its_engine_process_stop_when_the_trainer_is_killed(tmp_path):
    """The guard: a SIGKILLed trainer leaves no vLLM API server or engine core behind."""
    script = "\n".join([
        "from pathlib import Path",
        "from tests.fixtures.fake_vllm import fake_vllm_install",
        "from trl_thundersync.rollout.vllm_launch import VLLMServerProcess",
        f"install = fake_vllm_install(Path({str(tmp_path)!r}))",
        f"VLLMServerProcess(install, Path({str(tmp_path / 'serve')!r}), port=0, startup_timeout=60).start()",
        "print('ready', flush=True)",
        "import time; time.sleep(600)"])
    trainer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                               cwd=Path(__file__).resolve().parents[3])
    try:
        assert trainer.stdout.readline().strip() == "ready"
        server, engine = map(int, (tmp_path / "serve" / "pids").read_text().split())
        assert not _gone(server) and not _gone(engine)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(10)
        deadline = time.monotonic() + 30
        while not (_gone(server) and _gone(engine)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _gone(server) and _gone(engine)
    finally:
        trainer.kill()
