"""scripts/vllm_smoke.py without a server: its arguments, the `vllm serve` command it starts, the confirmed-version
read. Its run against the embedded server is tests/integration/test_vllm_smoke.py."""

from __future__ import annotations

import importlib.util
import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from tests.fixtures import http_stub

_SPEC = importlib.util.spec_from_file_location("vllm_smoke", Path(__file__).parents[2] / "scripts" / "vllm_smoke.py")
smoke = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(smoke)


@pytest.mark.parametrize("argv, message", [
    (["--model", "m"], "one of the arguments --url --serve --embedded is required"),
    (["--model", "m", "--url", "http://a:1", "--embedded"], "not allowed with argument"),
    (["--model", "m", "--url", "gpu-node:8000"], "--url='gpu-node:8000'"),
    (["--model", "m", "--url", "http://a:1", "--lora-url", "http://b"], None),
    (["--model", "m", "--embedded", "--prompts", "0"], "--prompts=0"),
])
def test_arguments(argv, message, capsys):
    if message is None:
        args = smoke.parse_args(argv)
        assert args.lora and args.lora_url == "http://b" and args.url == "http://a:1"
        return
    with pytest.raises(SystemExit):
        smoke.parse_args(argv)
    assert message in capsys.readouterr().err


def test_the_vllm_serve_command_is_a_rollout_server_for_this_package():
    command = smoke.vllm_serve_command("Qwen/Qwen3-0.6B", 8001, lora=True)
    assert command[:3] == ["vllm", "serve", "Qwen/Qwen3-0.6B"]
    joined = " ".join(command)
    assert "--logprobs-mode processed_logprobs" in joined and "--max-logprobs -1" in joined
    assert '--weight-transfer-config {"backend": "nccl"}' in joined and "--port 8001" in joined
    assert "--enable-lora" in joined and "--enable-lora" not in smoke.vllm_serve_command("m", 1, lora=False)
    assert smoke.vllm_serve_env(lora=True) == {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    assert smoke.vllm_serve_env(lora=False) == {"VLLM_SERVER_DEV_MODE": "1"}


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
