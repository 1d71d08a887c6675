"""The server engine's life cycle without a model: malformed addresses refused at construction, every wait ended by
close() or Ctrl-C, a dead server this process owns restarted (or reported) at once, temp folders that go with their
process.

A stub server in a thread speaks just enough of the embedded server's API (`/health`, `/v1/models`,
`/v1/completions`) and can be told to answer 503 or to hang.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from benchmarks.parity import cpu_config
from tests.fixtures import http_stub
from trl_thundersync import ThunderSyncGKDConfig, ThunderSyncGRPOConfig
from trl_thundersync.errors import ConfigurationError, RolloutError
from trl_thundersync.rollout.tempdir import OwnedTempDir
from trl_thundersync.rollout.vllm_api import POLICY_VERSION_HEADER
from trl_thundersync.rollout.vllm_client import VLLMServerEngine
from trl_thundersync.rollout.vllm_replicas import ServerExited, await_health
from trl_thundersync.types import RolloutRequest, SamplingParams

SAMPLING = SamplingParams(max_new_tokens=4, temperature=1.0)
SETTLE_S = 10.0  # how long a thread may take to end once nothing keeps it waiting (it takes milliseconds)


class StubServer:
    """`mode`: 'ok' answers a 2-token completion; '503' answers 503 to completions and then to /health; 'hang'
    accepts completions and never answers."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode, self.completions = mode, 0
        self.release = threading.Event()  # ends the 'hang' handlers when the test is over
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):  # noqa: N802
                if self.path == "/health":
                    self._send(503 if stub.mode == "503" and stub.completions else 200, None)
                else:
                    self._send(200, {"object": "list", "data": [{"id": "stub", "object": "model"}]})

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.completions += 1
                if stub.mode == "hang":
                    stub.release.wait(60.0)
                    return
                if stub.mode == "503":
                    self._send(503, {"error": {"message": "loading", "type": "ServiceUnavailableError"}})
                    return
                self._send(200, {"model": "stub", "choices": [{
                    "token_ids": [5, 6], "logprobs": {"token_logprobs": [-0.5, -0.25]},
                    "prompt_token_ids": body["prompt"], "finish_reason": "length"}]})

            def _send(self, status, payload):
                data = b"" if payload is None else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.send_header(POLICY_VERSION_HEADER, "0")
                self.end_headers()
                self.wfile.write(data)

        self.http, self.url = http_stub.start(Handler)

    def stop(self) -> None:
        self.release.set()
        http_stub.stop(self.http)


@pytest.fixture
def stubs():
    started: list[StubServer] = []

    def start(mode: str = "ok") -> StubServer:
        started.append(StubServer(mode))
        return started[-1]

    yield start
    for stub in started:
        stub.stop()


def _refused_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens there once the socket is closed


def _request(index: int = 0) -> RolloutRequest:
    return RolloutRequest(index=index, group=0, prompt_ids=(1, 2, 3), seed=7)


def _new_threads_end(before: set[threading.Thread]) -> list[str]:
    """Names of the threads started since `before` (but the stub servers' own) still alive after SETTLE_S."""
    deadline = time.monotonic() + SETTLE_S
    new = [t for t in set(threading.enumerate()) - before if "process_request_thread" not in t.name]
    for thread in new:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in new if t.is_alive()]


# -- malformed addresses: refused at construction, naming the field --------------------------------------------------
@pytest.mark.parametrize("url", ["localhost:8000", "http://", "http://gpu-node:99999", "http://gpu-node:80a",
                                 "ftp://gpu-node:8000", "http:/gpu-node:8000", "", "http://gpu-node:8000/?x=1",
                                 "gpu-node"])
def test_a_malformed_server_address_is_refused_by_the_engine(url):
    started = time.monotonic()
    with pytest.raises(ConfigurationError, match=r"base_urls=.*(server address|expected)"):
        VLLMServerEngine([url], None, SAMPLING, startup_timeout=1.0)
    assert time.monotonic() - started < SETTLE_S  # refused, not polled


@pytest.mark.parametrize("overrides, field", [
    (dict(rollout_engine="embedded_server", vllm_server_base_urls=["http://a:8000", "a:8001"]),
     r"vllm_server_base_urls\[1\]='a:8001'"),
    (dict(use_vllm=True, vllm_mode="server", vllm_server_base_url="http//gpu-node:8000"), "vllm_server_base_url="),
    (dict(use_vllm=True, vllm_mode="server", vllm_server_base_url="http://gpu-node:123456"),
     "vllm_server_base_url="),
    (dict(use_vllm=True, vllm_mode="server", vllm_server_host="http://gpu-node"), "vllm_server_host="),
    (dict(use_vllm=True, vllm_mode="server", vllm_server_port=0), "vllm_server_port=0"),
    (dict(use_vllm=True, vllm_mode="server", vllm_server_port=70000), "vllm_server_port=70000"),
])
def test_a_malformed_server_address_is_refused_by_the_config_naming_the_field(tmp_path, overrides, field):
    with pytest.raises(ConfigurationError, match=field):
        cpu_config(ThunderSyncGRPOConfig, tmp_path, **overrides)


def test_the_distillation_config_checks_addresses_the_same_way(tmp_path):
    with pytest.raises(ConfigurationError, match=r"vllm_server_base_urls\[0\]"):
        ThunderSyncGKDConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none",
                             rollout_engine="embedded_server", vllm_server_base_urls=["gpu-node:8000"])


@pytest.mark.parametrize("url", ["localhost:8001", "ftp://teacher:8001", "http://teacher:99999", "http://"])
def test_a_malformed_teacher_server_url_is_refused_naming_the_field(tmp_path, url):
    with pytest.raises(ConfigurationError, match="teacher_server_url"):
        ThunderSyncGKDConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", lmbda=1.0, objective="opd",
                             teacher_server_url=url)


def test_well_formed_addresses_pass(tmp_path):
    args = cpu_config(ThunderSyncGRPOConfig, tmp_path, use_vllm=True, vllm_mode="server",
                      vllm_server_base_urls=["http://10.0.0.5:8000", "https://gpu-node/v1-proxy/"])
    assert args.server_urls() == ["http://10.0.0.5:8000", "https://gpu-node/v1-proxy/"]


# -- waits that end: Ctrl-C, close(), an owned server's death --------------------------------------------------------
def test_a_refused_external_server_is_waited_for_like_trl_says_so_and_ctrl_c_ends_the_wait(caplog):
    """TRL's client polls an external server that refuses connections until `connection_timeout` (it may still be
    loading); so does the engine, but Ctrl-C ends it and no polling thread stays behind."""
    before = set(threading.enumerate())
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))  # a real Ctrl-C: it wakes blocked waits
    # Python's Ctrl-C handler, also where the run inherited SIGINT ignored (a background job of a non-interactive shell)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.monotonic()
    timer.start()
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(KeyboardInterrupt):
            VLLMServerEngine([_refused_url()], None, SAMPLING, startup_timeout=300.0)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - started < SETTLE_S
    assert "waiting up to 300 s" in caplog.text and "Ctrl-C" in caplog.text
    timer.join()
    assert _new_threads_end(before) == []


def test_close_ends_a_request_waiting_for_a_server_that_answers_503(stubs):
    """The defect: after close() stopped the servers, requests kept waiting `restart_timeout` (300 s) for them in
    non-daemon threads, so the process exited 5 minutes after Ctrl-C."""
    stub = stubs("503")
    before = set(threading.enumerate())
    engine = VLLMServerEngine([stub.url], None, SAMPLING, restart_timeout=300.0)
    engine.start_batch([_request()], policy_version=0)
    while not stub.completions:
        time.sleep(0.01)
    time.sleep(0.3)  # the request is now polling /health, which answers 503
    engine.close()
    with pytest.raises(RolloutError, match="closed"):
        list(engine.results())
    assert _new_threads_end(before) == []


def test_close_aborts_a_request_the_server_never_answers(stubs):
    stub = stubs("hang")
    before = set(threading.enumerate())
    engine = VLLMServerEngine([stub.url], None, SAMPLING, request_timeout=300.0)
    engine.start_batch([_request()], policy_version=0)
    while not stub.completions:
        time.sleep(0.01)
    engine.close()
    with pytest.raises(RolloutError, match="closed while it was in flight"):
        list(engine.results())
    assert _new_threads_end(before) == []


def test_the_wait_for_an_owned_server_ends_when_its_process_has_exited():
    started = time.monotonic()
    with pytest.raises(ServerExited, match="exited with code -9"):
        await_health(_refused_url(), 300.0, exited=lambda: "(pid 1) exited with code -9 (killed by SIGKILL)")
    assert time.monotonic() - started < SETTLE_S


class StubSupervisor:
    """Owns one stub server: `kill()` stops it; `restart()` starts a fresh one on a new port."""

    def __init__(self, stubs) -> None:
        self.stubs, self.server, self.dead, self.restarts = stubs, stubs(), False, 0

    def kill(self) -> None:
        self.server.stop()
        self.dead = True

    def exit_status(self, index: int) -> str | None:
        return "(pid 1) exited with code -9 (killed by SIGKILL); its log: boom" if self.dead else None

    def restart(self, index: int) -> str:
        self.server, self.dead = self.stubs(), False
        self.restarts += 1
        return self.server.url

    def close(self) -> None:
        self.closed = True


def test_an_owned_server_that_died_is_restarted_and_the_request_sent_again(stubs):
    supervisor = StubSupervisor(stubs)
    engine = VLLMServerEngine([supervisor.server.url], None, SAMPLING, supervisor=supervisor, restart_timeout=300.0)
    try:
        supervisor.kill()
        engine.start_batch([_request(0), _request(1)], policy_version=0)
        rollouts = list(engine.results())
        stats = engine.stats()
    finally:
        engine.close()
    assert sorted(r.index for r in rollouts) == [0, 1] and {r.completion_ids for r in rollouts} == {(5, 6)}
    assert supervisor.restarts == 1 and stats.replicas[0].restarts == 1
    assert engine.base_urls == (supervisor.server.url,) and supervisor.closed  # the new address; stopped by close()


def test_an_owned_server_that_died_fails_the_batch_at_once_without_restarts(stubs):
    supervisor = StubSupervisor(stubs)
    engine = VLLMServerEngine([supervisor.server.url], None, SAMPLING, supervisor=supervisor, restart_timeout=300.0,
                              max_restarts=0)
    try:
        supervisor.kill()
        started = time.monotonic()
        engine.start_batch([_request()], policy_version=0)
        with pytest.raises(RolloutError, match=r"(?s)killed by SIGKILL.*log: boom.*max_restarts=0"):
            list(engine.results())
        assert time.monotonic() - started < SETTLE_S
    finally:
        engine.close()
    assert supervisor.restarts == 0


def test_an_owned_server_that_died_between_batches_is_restarted_before_a_publication(stubs):
    import torch

    supervisor = StubSupervisor(stubs)
    engine = VLLMServerEngine([supervisor.server.url], None, SAMPLING, supervisor=supervisor,
                              publisher=_NullPublisher())
    try:
        supervisor.kill()
        engine.publish(torch.nn.Linear(1, 1), policy_version=1)
    finally:
        engine.close()
    assert supervisor.restarts == 1 and engine.policy_version == 1


class _NullPublisher:
    lora, concurrent = False, True

    def __init__(self) -> None:
        self.pushed: list[tuple[str, int]] = []

    def prepare(self, model, version):
        pass

    def push(self, url, version):
        self.pushed.append((url, version))

    def retire(self, urls, previous_version):
        pass

    def restore(self, url, version):
        self.push(url, version)
        return True

    def close(self):
        pass


# -- temp folders ----------------------------------------------------------------------------------------------------
def test_close_removes_an_owned_temp_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    folder = OwnedTempDir("thundersync-test-")
    (folder.path / "weights").write_bytes(b"x")
    assert folder.path.parent == tmp_path
    folder.close()
    folder.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_an_owned_temp_folder_goes_with_its_process_even_on_sigkill(tmp_path, signum):
    code = ("import sys, time; from trl_thundersync.rollout.tempdir import OwnedTempDir; "
            "d = OwnedTempDir('thundersync-test-'); print(d.path, flush=True); time.sleep(120)")
    repo = Path(__file__).resolve().parents[3]
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                               env={"PYTHONPATH": str(repo), "TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"})
    path = Path(process.stdout.readline().strip())
    assert path.is_dir() and path.parent == tmp_path
    process.send_signal(signum)
    process.wait(timeout=30)
    deadline = time.monotonic() + SETTLE_S
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not path.exists()
