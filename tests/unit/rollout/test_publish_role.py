"""Several learner processes sharing rollout servers, with fakes: two `VLLMServerEngine`s (rank 0 and a follower)
in threads of this process, a stub server whose version header the fake publisher sets, and a collective made of
a `threading.Barrier` in place of torch.distributed.

Only rank 0 builds a publisher and pushes; the follower waits at the barrier until every server acknowledged, then
carries the new version and refuses a server that reports another; rank 0's failure reaches the follower.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler

import pytest
import torch

from tests.fixtures import http_stub
from trl_thundersync.errors import RolloutError, StalePolicyError
from trl_thundersync.rollout import vllm_client
from trl_thundersync.rollout.publish_role import SINGLE_PROCESS, MainFailed, PublishRole, run_on_main
from trl_thundersync.rollout.vllm_api import POLICY_VERSION_HEADER
from trl_thundersync.rollout.vllm_client import VLLMServerEngine
from trl_thundersync.types import RolloutRequest, SamplingParams

SAMPLING = SamplingParams(max_new_tokens=4, temperature=1.0)
WAIT_S = 30.0  # generous bound on every wait of these tests (each takes milliseconds)


class VersionedStub:
    """Answers /health, /v1/models and a 2-token completion, each with the version header `self.version`."""

    def __init__(self) -> None:
        self.version, self.completions = 0, 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802
                self._send({"object": "list", "data": [{"id": "stub", "object": "model"}]})

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.completions += 1
                self._send({"model": "stub", "choices": [{
                    "token_ids": [5, 6], "logprobs": {"token_logprobs": [-0.5, -0.25]},
                    "prompt_token_ids": body["prompt"], "finish_reason": "length"}]})

            def _send(self, payload):
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.send_header(POLICY_VERSION_HEADER, str(stub.version))
                self.end_headers()
                self.wfile.write(data)

        self.http, self.url = http_stub.start(Handler)

    def stop(self) -> None:
        http_stub.stop(self.http)


class StubPublisher:
    """Sets the stub's version on push; `hold` keeps push waiting, `fail` makes it raise."""

    lora, concurrent = False, True

    def __init__(self, stub: VersionedStub, *, fail: bool = False) -> None:
        self.stub, self.fail = stub, fail
        self.hold = threading.Event()
        self.hold.set()
        self.pushed: list[int] = []

    def prepare(self, model, version):
        pass

    def push(self, url, version):
        assert self.hold.wait(WAIT_S)
        if self.fail:
            raise RolloutError(f"{url} refused version {version}: disk full")
        self.stub.version = version
        self.pushed.append(version)

    def retire(self, urls, previous_version):
        pass

    def restore(self, url, version):
        return False

    def close(self):
        pass


def two_ranks() -> tuple[PublishRole, PublishRole]:
    """Rank 0 and rank 1 of a fake two-process group: `share` is a barrier that hands out rank 0's value."""
    barrier, box = threading.Barrier(2, timeout=WAIT_S), {}

    def share_for(rank: int):
        def share(value):
            if rank == 0:
                box["value"] = value
            barrier.wait()
            got = box["value"]
            barrier.wait()  # nobody overwrites the value before both read it
            return got
        return share

    return PublishRole(0, 2, share_for(0)), PublishRole(1, 2, share_for(1))


@pytest.fixture
def stub():
    server = VersionedStub()
    yield server
    server.stop()


@pytest.fixture
def engines(stub, monkeypatch):
    """(rank 0's engine, the follower's engine, rank 0's publisher, the roles that asked for a publisher)."""
    main_role, follower_role = two_ranks()
    publisher = StubPublisher(stub)
    built: list[int] = []
    real = vllm_client.make_publisher

    def recording_make_publisher(spec, reported, nccl_options=None):
        built.append(threading.current_thread().name)
        return real(spec, reported, nccl_options)

    monkeypatch.setattr(vllm_client, "make_publisher", recording_make_publisher)
    main = VLLMServerEngine([stub.url], None, SAMPLING, publisher=publisher, role=main_role)
    follower = VLLMServerEngine([stub.url], None, SAMPLING, publisher="auto", role=follower_role)
    yield main, follower, publisher, built
    main.close()
    follower.close()


def _sample(engine: VLLMServerEngine, index: int = 0):
    return engine.submit(RolloutRequest(index=index, group=0, prompt_ids=(1, 2, 3), seed=7)).result(WAIT_S)


def test_only_rank_0_publishes_and_the_follower_carries_the_version_after_the_barrier(engines, stub):
    main, follower, publisher, built = engines
    assert len(built) == 1 and follower._publisher is None  # the follower never built a publisher
    publisher.hold.clear()  # rank 0's push waits until the test lets it go
    with ThreadPoolExecutor(2) as pool:
        followed = pool.submit(follower.publish, torch.nn.Linear(1, 1), 1)
        published = pool.submit(main.publish, torch.nn.Linear(1, 1), 1)
        with pytest.raises(TimeoutError):
            followed.result(timeout=0.3)  # held at the barrier while no server acknowledged
        assert follower.policy_version == 0
        publisher.hold.set()
        published.result(WAIT_S)
        followed.result(WAIT_S)
    assert publisher.pushed == [1]  # pushed once, by rank 0
    assert main.policy_version == follower.policy_version == 1
    assert _sample(follower).policy_version == 1 and _sample(main, 1).policy_version == 1


def test_the_follower_refuses_a_server_that_reports_another_version(engines, stub):
    main, follower, _, _ = engines
    with ThreadPoolExecutor(2) as pool:
        done = [pool.submit(e.publish, torch.nn.Linear(1, 1), 1) for e in (main, follower)]
        for future in done:
            future.result(WAIT_S)
    stub.version = 0  # e.g. a server that restarted from its start-up weights
    with pytest.raises(StalePolicyError, match="policy version 0, the batch is at version 1"):
        _sample(follower)


def test_a_failed_publication_on_rank_0_ends_the_follower_with_its_cause(stub):
    main_role, follower_role = two_ranks()
    main = VLLMServerEngine([stub.url], None, SAMPLING, publisher=StubPublisher(stub, fail=True), role=main_role)
    follower = VLLMServerEngine([stub.url], None, SAMPLING, role=follower_role)
    try:
        with ThreadPoolExecutor(2) as pool:
            followed = pool.submit(follower.publish, torch.nn.Linear(1, 1), 1)
            published = pool.submit(main.publish, torch.nn.Linear(1, 1), 1)
            with pytest.raises(RolloutError, match="disk full"):
                published.result(WAIT_S)
            with pytest.raises(RolloutError, match=r"main process \(rank 0\) failed publishing policy version 1.*"
                                                   "disk full"):
                followed.result(WAIT_S)
        with pytest.raises(RolloutError, match="failed earlier"):  # the follower's engine is unusable, like rank 0's
            _sample(follower)
    finally:
        main.close()
        follower.close()


def test_run_on_main_runs_once_and_hands_the_value_or_the_failure_to_every_rank():
    main_role, follower_role = two_ranks()
    calls: list[int] = []
    with ThreadPoolExecutor(2) as pool:
        values = [pool.submit(run_on_main, role, "counting", lambda r=role.rank: calls.append(r) or "urls")
                  for role in (main_role, follower_role)]
        assert [v.result(WAIT_S) for v in values] == ["urls", "urls"]
    assert calls == [0]

    def boom():
        raise OSError("no free port")

    with ThreadPoolExecutor(2) as pool:
        failed = [pool.submit(run_on_main, role, "starting 1 embedded server(s)", boom)
                  for role in (main_role, follower_role)]
        with pytest.raises(OSError, match="no free port"):
            failed[0].result(WAIT_S)
        with pytest.raises(RolloutError, match=r"starting 1 embedded server\(s\).*OSError: no free port"):
            failed[1].result(WAIT_S)
    assert run_on_main(SINGLE_PROCESS, "alone", lambda: 3) == 3
    assert MainFailed("x", "y") == MainFailed("x", "y")


def test_one_process_needs_no_collective_and_several_need_torch_distributed():
    from trl_thundersync.errors import ConfigurationError
    from trl_thundersync.rollout.publish_role import distributed_role

    assert distributed_role(0, 1) is SINGLE_PROCESS and SINGLE_PROCESS.main
    if not torch.distributed.is_initialized():
        with pytest.raises(ConfigurationError, match="torch.distributed is not initialized.*accelerate launch"):
            distributed_role(1, 2)
