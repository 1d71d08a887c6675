"""The rollout seam: the `TurnGenerator` Protocol, `start_batch`/`results` over any `submit` (`SubmittedBatch`,
`TurnBatchEngine`), engines' own step metrics, and `make_agent_engine` driving a 30-line stub generator."""

from __future__ import annotations

import threading

import pytest

from tests.fixtures.stub_generator import StubGenerator
from trl_thundersync.errors import RolloutError
from trl_thundersync.rollout.agent_engine import AgentRolloutEngine
from trl_thundersync.rollout.agent_setup import agent_chat_template, environment_factories, make_agent_engine
from trl_thundersync.rollout.batches import SubmittedBatch, TurnBatchEngine, as_rollout_engine
from trl_thundersync.rollout.engine import RolloutEngine, TurnGenerator, engine_step_metrics
from trl_thundersync.types import RolloutRequest


def requests(n: int, start: int = 0) -> list[RolloutRequest]:
    return [RolloutRequest(index=i, group=i // 2, prompt_ids=(1, 2, 3 + i), seed=i) for i in range(start, start + n)]


def test_the_stub_and_the_builtin_engines_satisfy_the_protocols():
    from trl_thundersync.rollout.local import LocalProcessEngine
    from trl_thundersync.rollout.vllm_client import VLLMServerEngine

    assert isinstance(StubGenerator(), TurnGenerator)
    assert not isinstance(StubGenerator(), RolloutEngine)  # submit only: no start_batch/results
    assert isinstance(TurnBatchEngine(StubGenerator()), RolloutEngine)
    for cls in (LocalProcessEngine, VLLMServerEngine):  # both halves, checked on the class (no worker started)
        for name in ("submit", "publish", "close", "start_batch", "results", "step_metrics", "policy_version"):
            assert hasattr(cls, name), (cls, name)


def test_results_arrive_in_completion_order_and_close_the_batch():
    stub = StubGenerator(hold=True)
    batch = SubmittedBatch()
    batch.start(stub.submit, requests(3), 0, serving_version=0)
    assert batch.open == 3 and stub.keys == [0, 1, 2]
    for key in (2, 0, 1):
        stub.release(key)
    assert [r.index for r in batch.results()] == [2, 0, 1]
    assert batch.open is None
    stub.hold = False
    batch.start(stub.submit, requests(2), 0, serving_version=0)  # the next batch may start
    assert sorted(r.index for r in batch.results()) == [0, 1]


@pytest.mark.parametrize("reqs, version, match", [
    (requests(2), 1, r"start_batch\(policy_version=1\) but the servers serve version 0; publish"),
    (requests(1) + requests(1), 0, "distinct indices"),
    ([RolloutRequest(index=0, group=0, prompt_ids=(), seed=0)], 0, "non-empty prompt_ids"),
])
def test_a_bad_batch_is_refused_before_anything_is_submitted(reqs, version, match):
    stub = StubGenerator()
    batch = SubmittedBatch("the servers serve")
    with pytest.raises(RolloutError, match=match):
        batch.start(stub.submit, reqs, version, serving_version=0)
    assert stub.keys == [] and batch.open is None


def test_one_batch_at_a_time_and_results_need_a_batch():
    stub = StubGenerator(hold=True)
    batch = SubmittedBatch()
    with pytest.raises(RolloutError, match="without an open batch"):
        next(batch.results())
    batch.start(stub.submit, requests(2), 0, serving_version=0)
    with pytest.raises(RolloutError, match=r"a batch is still open \(2 rollouts not yet consumed"):
        batch.start(stub.submit, requests(2, start=5), 0, serving_version=0)
    assert stub.keys == [0, 1]


def test_a_failed_or_cancelled_request_ends_the_batch_loudly():
    stub = StubGenerator(hold=True)
    batch = SubmittedBatch()
    batch.start(stub.submit, requests(3), 0, serving_version=0)
    stub.release(1)
    stub.release(0, RolloutError("replica gone"))
    results = batch.results()
    assert next(results).index == 1
    with pytest.raises(RolloutError, match="replica gone"):
        next(results)
    assert batch.open is None  # nothing partial is handed on; a new batch may start

    batch.start(stub.submit, requests(1, start=4), 0, serving_version=0)
    stub.futures[4][0].cancel()
    with pytest.raises(RolloutError, match="closed while the batch was open"):
        list(batch.results())


def test_a_refused_submit_leaves_no_batch_open():
    calls = []

    def submit(request):
        calls.append(request.index)
        if len(calls) == 2:
            raise RolloutError("the engine is closed")
        return StubGenerator().submit(request)

    batch = SubmittedBatch()
    with pytest.raises(RolloutError, match="closed"):
        batch.start(submit, requests(3), 0, serving_version=0)
    assert batch.open is None


def test_turn_batch_engine_over_a_stub_generator():
    stub = StubGenerator()
    engine = as_rollout_engine(stub)
    assert isinstance(engine, TurnBatchEngine) and as_rollout_engine(engine) is engine
    engine.start_batch(requests(2), policy_version=0)
    with pytest.raises(RolloutError, match="cannot publish while a batch is open"):
        engine.publish(None, 1)
    assert sorted(r.completion_ids for r in engine.results()) == [(7, 8), (7, 8)]
    assert engine.publish(None, 1) == 0.0 and engine.policy_version == 1 and stub.publications == [1]
    with pytest.raises(RolloutError, match="generator serves version 1"):
        engine.start_batch(requests(2), policy_version=0)
    assert engine.step_metrics() == {"rollout/stub_requests": 2.0}
    engine.close()
    assert stub.closed


def test_step_metrics_default_to_none():
    class Plain:
        def close(self):
            pass

    assert engine_step_metrics(Plain()) == {}
    assert engine_step_metrics(TurnBatchEngine(Plain())) == {}
    assert RolloutEngine.step_metrics(Plain()) == {}  # the Protocol's default body, for engines that subclass it


def test_server_engine_reports_its_replicas_as_step_metrics():
    from trl_thundersync.rollout.vllm_client import VLLMServerEngine
    from trl_thundersync.rollout.vllm_replicas import ServerEngineStats

    stats = ServerEngineStats(in_flight=0, peak_in_flight=3, trajectories=4, tokens=40, time_to_first_result=0.5,
                              turn_latency_p50=None, turn_latency_p90=None, turn_latency_p99=None, publications=1,
                              last_publication_seconds=0.25, replicas=())
    engine = VLLMServerEngine.__new__(VLLMServerEngine)  # no servers: only the metric path
    engine.stats = lambda: stats
    assert engine.step_metrics() == {"rollout/in_flight_peak": 3.0, "rollout/tokens": 40.0,
                                     "rollout/time_to_first_result_s": 0.5, "rollout/publication_s": 0.25}


def test_environment_factories_follow_trl():
    def factory():
        return object()

    assert environment_factories(None) == (None, False)
    assert environment_factories(factory) == ({None: factory}, False)
    assert environment_factories({None: factory}) == ({None: factory}, False)  # TRL's normalized single form
    assert environment_factories({"a": factory}) == ({"a": factory}, True)


# -- make_agent_engine over the stub ----------------------------------------------------------------------------------
class CounterEnv:
    created = 0

    def __init__(self) -> None:
        CounterEnv.created += 1

    def reset(self, **row) -> None:
        self.count = 0

    def increment(self, amount: int) -> str:
        """Add an amount to the counter.

        Args:
            amount: how much to add
        """
        self.count += amount
        return f"counter={self.count}"


class ToollessEnv:
    def reset(self, **row) -> None:
        return None


def test_the_chat_template_follows_trls_rule(tokenizer):
    from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving

    assert agent_chat_template(tokenizer, has_tools=False) is None
    expected = None if is_chat_template_prefix_preserving(tokenizer) else get_training_chat_template(tokenizer)
    assert agent_chat_template(tokenizer, has_tools=True) == expected
    with_tools = make_agent_engine(StubGenerator(), processing_class=tokenizer, limits=_limits(),
                                   environment_factory=CounterEnv)
    without = make_agent_engine(StubGenerator(), processing_class=tokenizer, limits=_limits(),
                                environment_factory=ToollessEnv)  # no public method: no tools, as in TRL
    assert with_tools.chat_template == expected and without.chat_template is None


def _limits():
    from trl_thundersync.envs.harness.agent_loop import AgentLimits

    return AgentLimits(max_turns=2, max_tokens_per_turn=16, max_completion_tokens=16, max_context_tokens=512,
                       max_observation_tokens=32, tool_timeout_s=5.0)


def test_a_stub_generator_drives_the_agent_engine(tokenizer):
    stub, turns = StubGenerator(answer=tokenizer.encode("Done.", add_special_tokens=False)
                                + [tokenizer.eos_token_id]), []
    lock = threading.Lock()

    def on_turn(event):
        with lock:
            turns.append((event.index, event.turn))

    CounterEnv.created = 0
    engine = make_agent_engine(stub, processing_class=tokenizer, limits=_limits(), environment_factory=CounterEnv,
                               on_turn=on_turn, max_concurrent=4)
    assert isinstance(engine, AgentRolloutEngine) and CounterEnv.created == 1  # TRL's probe, kept in the pool
    batch = [RolloutRequest(index=i, group=0, prompt_ids=(), seed=i, prompt=[{"role": "user", "content": f"Hi {i}"}],
                            row={}) for i in range(3)]
    engine.start_batch(batch, policy_version=0)
    rollouts = sorted(engine.results(), key=lambda r: r.index)
    assert [r.index for r in rollouts] == [0, 1, 2] and CounterEnv.created == 3  # the probe served trajectory 0
    assert all(r.completion_ids == stub.answer and r.policy_version == 0 for r in rollouts)
    assert sorted(stub.keys) == [(0, 0), (1, 0), (2, 0)] and sorted(turns) == sorted(stub.keys)
    assert engine.publish(None, 1) == 0.0 and stub.publications == [1]
    with pytest.raises(RolloutError, match="generator serves version 1"):
        engine.start_batch(batch, policy_version=0)
    assert engine.step_metrics() == {"rollout/stub_requests": 3.0}
    engine.close()
    assert stub.closed
