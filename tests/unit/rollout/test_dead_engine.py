"""A vLLM server whose engine core died fails the batch at once with vLLM's message (`vllm_api.engine_dead`), while a
server restarted at the same address is still waited for.

The stub answers as vLLM 0.32 does (read from its source, `vllm_api.py` cites the files): after the engine dies,
every completion gets HTTP 500 `{"error": {"message": "EngineCore encountered an issue. See stack trace (above) for
the root cause.", "type": "InternalServerError", ...}}`, /health 503 with no body, and then the server exits
(connections are refused). The real server: `tests/real_vllm/test_dead_engine.py`.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.fixtures import http_stub
from trl_thundersync.errors import DeadEngineError, RolloutError
from trl_thundersync.rollout.vllm_api import HTTPReply, engine_dead
from trl_thundersync.rollout.vllm_client import VLLMServerEngine
from trl_thundersync.types import RolloutRequest, SamplingParams

SAMPLING = SamplingParams(max_new_tokens=4)
VLLM_DEAD = {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                       "type": "InternalServerError", "param": None, "code": 500}}


class NullPublisher:
    lora, concurrent = False, True

    def prepare(self, model, version): ...
    def push(self, url, version): ...
    def retire(self, urls, previous_version): ...
    def restore(self, url, version): return True
    def close(self): ...


class EngineStub:
    """`mode` 'ok': completions answered; 'dead': the engine died (500 + vLLM's message, /health 503, and the server
    exits once `dead_answers` such answers were sent); 'restarting': connections dropped, /health 503 with a body."""

    def __init__(self, port: int = 0) -> None:
        self.mode, self.dead_answers, self.answer_delay = "ok", 1, 0.0
        self.completions: list[dict] = []
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802
                path = self.path.split("?")[0]
                if path == "/health":
                    if stub.mode == "dead":
                        self._send(503, None)
                    elif stub.mode == "restarting":
                        self._send(503, {"error": {"message": "loading", "type": "ServiceUnavailableError"}})
                    else:
                        self._send(200, None)
                elif path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": "base", "object": "model"}]})
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with stub.lock:
                    stub.completions.append(body)
                    mode = stub.mode
                if mode == "restarting":
                    self.close_connection = True  # no answer: RemoteDisconnected on the client
                    return
                time.sleep(stub.answer_delay)
                if mode == "dead":
                    self._send(500, VLLM_DEAD)
                    with stub.lock:
                        stub.dead_answers -= 1
                        exits = stub.dead_answers == 0
                    if exits:  # vLLM's terminate_if_errored: the API server shuts down after answering
                        threading.Thread(target=stub.stop, daemon=True).start()
                    return
                self._send(200, {"model": "base", "choices": [{
                    "index": 0, "text": "", "token_ids": [5, 6], "prompt_token_ids": body["prompt"],
                    "logprobs": {"token_logprobs": [-0.5, -0.25], "tokens": ["token_id:5", "token_id:6"]},
                    "finish_reason": "length"}]})

            def _send(self, status, payload):
                data = b"" if payload is None else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.handler = Handler
        if port:
            self.http = ThreadingHTTPServer(("127.0.0.1", port), Handler)
            self.http.daemon_threads = True
            threading.Thread(target=self.http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
            self.url = f"http://127.0.0.1:{port}"
        else:
            self.http, self.url = http_stub.start(Handler)
        self.port = self.http.server_address[1]

    def stop(self) -> None:
        if self.http is not None:
            http_stub.stop(self.http)
            self.http = None


@pytest.fixture
def stubs():
    started: list[EngineStub] = []

    def start(port: int = 0) -> EngineStub:
        started.append(EngineStub(port))
        return started[-1]

    yield start
    for stub in started:
        stub.stop()


def requests(n: int) -> list[RolloutRequest]:
    return [RolloutRequest(index=i, group=0, prompt_ids=(1, 2, 3), seed=10 + i) for i in range(n)]


def engine(url: str, **kwargs) -> VLLMServerEngine:
    return VLLMServerEngine([url], None, SAMPLING, publisher=NullPublisher(), startup_timeout=5.0,
                            restart_timeout=300.0, **kwargs)


def test_vllms_dead_engine_answer_is_recognized_and_nothing_else_is():
    dead = HTTPReply(500, {}, json.dumps(VLLM_DEAD).encode())
    assert engine_dead(dead)
    assert not engine_dead(HTTPReply(503, {}, json.dumps(VLLM_DEAD).encode()))  # only vLLM's 500 says it
    other = {"error": {"message": "CUDA out of memory", "type": "InternalServerError", "code": 500}}
    assert not engine_dead(HTTPReply(500, {}, json.dumps(other).encode()))
    assert not engine_dead(HTTPReply(500, {}, b"Internal Server Error"))


def test_a_dead_engine_fails_the_batch_at_once_naming_vllms_message(stubs):
    """The defect: the 500 was sent again, the server had exited, and the batch waited restart_timeout (300 s) for a
    restart, then failed naming ConnectionRefusedError."""
    stub = stubs()
    eng = engine(stub.url, max_concurrency=4)
    try:
        stub.mode, stub.dead_answers = "dead", 1
        start = time.perf_counter()
        with pytest.raises(DeadEngineError, match="EngineCore encountered an issue") as failure:
            eng.start_batch(requests(4), policy_version=0)  # raises here if an answer came before the last submit
            list(eng.results())
        assert time.perf_counter() - start < 5.0
        assert stub.url in str(failure.value) and "server's log" in str(failure.value)
        assert isinstance(failure.value, RolloutError)
        with pytest.raises(DeadEngineError, match="failed earlier"):  # the engine is unusable from then on
            eng.start_batch(requests(1), policy_version=0)
    finally:
        eng.close()
    seeds = [body["seed"] for body in stub.completions]
    assert len(seeds) == len(set(seeds))  # no request was sent again
    assert eng.stats().replicas[0].alive is False


def test_a_request_waiting_for_a_restart_stops_when_another_learns_the_engine_died(stubs):
    """Trajectory 0 loses its connection and waits for the replica (its /health answers 503 'loading'); trajectory
    1 then gets vLLM's dead-engine answer: both fail within seconds, not after restart_timeout."""
    stub = stubs()
    eng = engine(stub.url, max_concurrency=2)
    try:
        stub.mode = "restarting"
        start = time.perf_counter()
        waiting = eng.submit(requests(1)[0])
        while not stub.completions:
            time.sleep(0.01)
        time.sleep(0.3)  # trajectory 0 now polls /health
        stub.mode, stub.dead_answers = "dead", 100  # the server stays up: VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1
        told = eng.submit(requests(2)[1])
        with pytest.raises(DeadEngineError, match="EngineCore encountered an issue"):
            told.result(timeout=10)
        with pytest.raises(DeadEngineError, match="EngineCore encountered an issue"):
            waiting.result(timeout=10)
        assert time.perf_counter() - start < 5.0
    finally:
        eng.close()


def test_a_server_restarted_at_the_same_address_is_still_waited_for(stubs):
    """No dead-engine answer: refused connections are a restart (someone restarts `vllm serve`), waited for, and the
    request is sent again with its seed."""
    stub = stubs()
    eng = engine(stub.url, max_concurrency=1)
    port = stub.port
    try:
        stub.stop()  # the server went away (restarting) without a dead-engine answer

        def come_back():
            time.sleep(1.0)
            stubs(port)

        threading.Thread(target=come_back, daemon=True).start()
        eng.start_batch(requests(1), policy_version=0)
        rollouts = list(eng.results())
    finally:
        eng.close()
    assert rollouts[0].completion_ids == (5, 6)
    assert eng.stats().replicas[0].retries == 1


def test_a_managed_servers_dead_engine_is_reported_with_the_first_error_of_its_log(stubs, tmp_path):
    """A server this process started (`ManagedVLLMServers`): the error also quotes the root cause from its log."""
    from trl_thundersync.rollout.vllm_launch import first_error

    log = tmp_path / "server-0.log"
    log.write_text("(EngineCore pid=7) INFO 12-03 20:17:31 [core.py:1] step\n"
                   "(Worker pid=9) ERROR 12-03 20:17:32 [multiproc_executor.py:1063] RuntimeError: CPU Generator "
                   "does not use offset\n"
                   "(APIServer pid=5) ERROR 12-03 20:17:33 [async_llm.py:1] EngineDeadError: EngineCore encountered "
                   "an issue.\n")

    class Supervisor:
        def exit_status(self, index):
            return None

        def root_cause(self, index):
            return first_error(log)

        def close(self):
            pass

    stub = stubs()
    eng = engine(stub.url, max_concurrency=2, supervisor=Supervisor())
    try:
        stub.mode, stub.dead_answers = "dead", 1
        with pytest.raises(DeadEngineError, match="The first error in its log: RuntimeError: CPU Generator does not "
                                                  "use offset"):
            eng.start_batch(requests(2), policy_version=0)
            list(eng.results())
    finally:
        eng.close()
