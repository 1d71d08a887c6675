"""Release at content readiness: H_i computed before the reward, bound to it later (hand-written fakes, no model)."""

from __future__ import annotations

import math
import queue
import threading
import time
from functools import partial

import pytest
import torch

from trl_thundersync.errors import BatchIncompleteError
from trl_thundersync.streaming.learner import GRPOBatchLearner, SourceGradients
from trl_thundersync.streaming.learner_records import BatchTiming
from trl_thundersync.streaming.pipeline import TurnRouter, run_logical_batch
from trl_thundersync.streaming.release import LEARNER_BOUND, TURN_ENTRY, step_release
from trl_thundersync.types import Rollout, RolloutRequest, ScoredRollout, TurnEvent

P = 6


def rollout(index, g=2, finished=0.0):
    return Rollout(index=index, group=index // g, policy_version=0, prompt_ids=(1,), completion_ids=(2, 3, 4),
                   finished_at=finished)


def grads_of(index, with_free=True):
    gen = torch.Generator().manual_seed(index)
    score = torch.randn(P, generator=gen)
    free = torch.randn(P, generator=gen) if with_free else None
    return SourceGradients(score, free, 3 + index % 2, free_value=0.1 * index, kl_sum=0.2 * index)


class Backward:
    """Deterministic fake gradients per trajectory; counts calls by release point."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def __call__(self, source: ScoredRollout, bucket: int) -> SourceGradients:
        self.calls.append(("reward", source.rollout.index))
        g = grads_of(source.rollout.index)
        return SourceGradients(g.score_grad if source.scorable else None, g.free_grad, g.scored_tokens,
                               g.free_value, g.kl_sum)

    def content(self, r: Rollout, bucket: int) -> SourceGradients:
        self.calls.append(("content", r.index))
        return grads_of(r.index)


def make(release="content", batch=8, **kw):
    backward = Backward()
    learner = GRPOBatchLearner(batch_size=batch, num_generations=2, num_params=P, policy_version=0,
                               scale_rewards="group", source_backward=backward, release=release,
                               content_backward=backward.content, **kw)
    return learner, backward


REWARDS = [0.3, 1.2, -0.7, 0.4, 2.0, 2.5, math.nan, 0.1]


def scored(index, at=1.0):
    return ScoredRollout(rollout(index), (REWARDS[index],), REWARDS[index], at)


def run(learner, order, content_first=True):
    if content_first:
        for i in order:
            learner.submit_content(rollout(i, finished=0.5))
    for i in order:
        learner.submit(scored(i))
    return learner.finish()


def direction(totals):
    return totals.accumulator.direction({0: 1.0}, 1.0)


@pytest.mark.parametrize("cap", [None, 1, 3])
def test_content_release_equals_reward_release_for_any_cap(cap):
    order = [5, 0, 3, 6, 1, 7, 2, 4]
    ref = run(make("reward")[0], order, content_first=False)
    learner, backward = make("content", max_buffered=cap)
    totals = run(learner, order)
    assert torch.allclose(direction(totals), direction(ref), rtol=1e-6, atol=1e-6)
    assert totals.scored_tokens == ref.scored_tokens and totals.free_values == ref.free_values
    assert totals.kl_sums == ref.kl_sums
    content = [i for kind, i in backward.calls if kind == "content"]
    assert len(content) == (cap or 8) and not set(content) & {i for k, i in backward.calls if k == "reward"}
    assert totals.peak_held == (cap or 8)
    kinds = {w.index: w.kind for w in totals.work if w.kind in ("content", "trajectory")}
    assert sorted(kinds) == list(range(8))
    binds = [w for w in totals.work if w.kind == "bind"]
    assert len(binds) == len(content) and all(w.content_ready == 0.5 and w.reward_at == 1.0 for w in binds)
    assert all(w.reward_at == 1.0 for w in totals.work if w.kind == "content")  # filled in at the barrier


def test_the_reward_point_ignores_content_and_sync_never_sees_it():
    learner, backward = make("reward")
    run(learner, range(8))
    assert {kind for kind, _ in backward.calls} == {"reward"}


def test_an_unscorable_reward_drops_h_but_keeps_the_kl_term_and_tokens():
    learner, _ = make("content")
    totals = run(learner, range(8))
    assert math.isnan(learner.closed[3].rewards[0]) and learner.closed[3].rewards[1] == pytest.approx(0.1)
    assert totals.scored_tokens[6] == grads_of(6).scored_tokens and totals.kl_sums[6] == pytest.approx(1.2)
    ref = run(make("reward")[0], range(8), content_first=False)
    assert torch.allclose(totals.accumulator.free_terms[0], ref.accumulator.free_terms[0], atol=1e-6)


def test_a_reward_that_never_arrives_fails_the_barrier_naming_it_and_frees_the_buffers():
    learner, _ = make("content")
    for i in range(8):
        learner.submit_content(rollout(i))
    for i in range(8):
        if i != 4:
            learner.submit(scored(i))
    with pytest.raises(BatchIncompleteError, match=r"reward never arrived \(first: \[4\]\)"):
        learner.finish()
    assert not learner.buffered


def test_content_twice_or_after_the_reward_is_refused():
    learner, _ = make("content")
    learner.submit_content(rollout(0))
    with pytest.raises(BatchIncompleteError, match="finished twice"):
        learner.submit_content(rollout(0))
    learner.submit(scored(1))
    with pytest.raises(BatchIncompleteError, match="after its reward"):
        learner.submit_content(rollout(1))


class FakeTurns:
    """A turn source that records what it was asked and returns the trajectory's gradients at finish."""

    def __init__(self, mismatch=()):
        self.turns: list[tuple[int, int]] = []
        self.discarded: list[int] = []
        self.mismatch = set(mismatch)

    def turn(self, event):
        self.turns.append((event.index, event.turn))
        return len(event.action_ids)

    def finish(self, r, bucket):
        return None if r.index in self.mismatch else grads_of(r.index)

    def discard(self, index):
        self.discarded.append(index)

    def held_bytes(self):
        return 0


def test_turn_release_runs_turns_then_closes_and_falls_back_on_a_mismatch():
    turns = FakeTurns(mismatch={2})
    backward = Backward()
    learner = GRPOBatchLearner(batch_size=4, num_generations=2, num_params=P, policy_version=0,
                               scale_rewards="group", source_backward=backward, release="turn",
                               content_backward=backward.content, turn_source=turns, max_buffered=3)
    for i in range(4):
        for t in range(2):
            learner.submit_turn(TurnEvent(i, t, 0, (1,), (5, 6), 0.1 * t))
    assert turns.turns == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]  # trajectory 3 found no slot
    for i in range(4):
        learner.submit_content(rollout(i))
    for i in range(4):
        learner.submit(scored(i))
    totals = learner.finish()
    kinds = [w.kind for w in totals.work if w.index == 2]
    assert kinds[:2] == ["turn", "turn"] and "content" in kinds and totals.turn_fallbacks == 1
    assert [w.kind for w in totals.work if w.index == 3] == ["trajectory"]  # released at its reward
    ref = GRPOBatchLearner(batch_size=4, num_generations=2, num_params=P, policy_version=0, scale_rewards="group",
                           source_backward=Backward())
    for i in range(4):
        ref.submit(scored(i))
    assert torch.allclose(direction(totals), direction(ref.finish()), atol=1e-6)


class SlowRewardEngine:
    """Trajectories finish at once; the learner must get their content before the (slow) reward call returns."""

    def __init__(self, n):
        self.n = n

    def start_batch(self, requests, policy_version):
        self.requests = list(requests)

    def results(self):
        for req in self.requests:
            yield rollout(req.index, finished=time.perf_counter())


def test_content_backward_runs_while_the_reward_is_computed_and_a_slow_grader_holds_back_no_content():
    learner, backward = make("content", batch=4)
    contents: list[int] = []
    all_content = threading.Event()
    original = backward.content

    def content(r, bucket):
        contents.append(r.index)
        if len(contents) == 4:
            all_content.set()
        return original(r, bucket)

    learner.content_backward = content

    def score(r):
        # trajectory 0's grader takes until the learner has the content of every trajectory (a slow SWE test run):
        # it would time out if content were handed over only after the grading of the trajectories before it
        if r.index == 0:
            assert all_content.wait(timeout=30), f"content seen before grading finished: {contents}"
        return [ScoredRollout(r, (REWARDS[r.index],), REWARDS[r.index], time.perf_counter())]

    requests = [RolloutRequest(i, i // 2, (1,), seed=i) for i in range(4)]
    totals, _ = run_logical_batch(SlowRewardEngine(4), requests, 0, score, learner)
    content_items = [w for w in totals.work if w.kind == "content"]
    assert [w.index for w in content_items] == [0, 1, 2, 3]
    assert all(w.start < w.reward_at for w in content_items)  # every backward began before its reward existed


def test_a_grader_that_raises_voids_the_batch_with_its_error_and_frees_the_buffers():
    learner, _ = make("content", batch=4)

    def score(r):
        if r.index == 2:
            raise RuntimeError("grader crashed on trajectory 2")
        return [ScoredRollout(r, (REWARDS[r.index],), REWARDS[r.index], time.perf_counter())]

    requests = [RolloutRequest(i, i // 2, (1,), seed=i) for i in range(4)]
    with pytest.raises(RuntimeError, match="grader crashed on trajectory 2"):
        run_logical_batch(SlowRewardEngine(4), requests, 0, score, learner)
    assert not learner.buffered and not learner.turning


def test_a_grpo_turn_router_drops_events_nobody_listens_to_and_a_distillation_one_refuses():
    event = TurnEvent(0, 0, 0, (1,), (2,), 0.0)
    TurnRouter(required=False)(event)
    from trl_thundersync.errors import RolloutError

    with pytest.raises(RolloutError, match="no batch is open"):
        TurnRouter()(event)
    inbox: queue.Queue = queue.Queue()
    router = TurnRouter(required=False)
    router.open(inbox)
    router(event)
    assert inbox.get_nowait() is event


def test_config_refuses_unknown_release_points_caps_and_turn_release_with_checkpointing(tmp_path):
    from benchmarks.parity import cpu_config
    from trl_thundersync import ThunderSyncGRPOConfig
    from trl_thundersync.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="release='tokens' is not one of"):
        cpu_config(ThunderSyncGRPOConfig, tmp_path, release="tokens")
    with pytest.raises(ConfigurationError, match="max_buffered_trajectories=0 must be ≥ 1"):
        cpu_config(ThunderSyncGRPOConfig, tmp_path, release="content", max_buffered_trajectories=0)
    with pytest.raises(ConfigurationError, match="release='turn' with gradient_checkpointing=True.*release='content'"):
        cpu_config(ThunderSyncGRPOConfig, tmp_path, release="turn", gradient_checkpointing=True)
    config = cpu_config(ThunderSyncGRPOConfig, tmp_path, release="content", gradient_checkpointing=True)
    assert config.release == "content"


def test_a_rollout_without_a_finish_time_is_ready_when_it_reaches_the_learner():
    learner, _ = make("content", batch=2)
    before = time.perf_counter()
    learner.submit_content(rollout(0))  # finished_at = 0.0: an engine that does not stamp its rollouts
    item = learner.work[-1]
    assert item.ready == item.content_ready >= before and learner.buffered[0].content_ready == item.ready


def _timing(busy: float, rollout: float = 4.0, turns_released: bool | None = True) -> BatchTiming:
    return BatchTiming(start=10.0, rollout_end=10.0 + rollout, learner_busy=busy, barrier=10.0 + rollout + 0.5,
                       turns_released=turns_released)


def test_adaptive_turn_release_runs_a_step_after_a_learner_bound_one_as_content_release():
    assert step_release("turn", True, None) == "turn"  # the first step releases per turn
    assert step_release("turn", True, _timing(busy=LEARNER_BOUND * 4.0)) == "content"
    assert step_release("turn", True, _timing(busy=6.0)) == "content"
    assert step_release("turn", True, _timing(busy=LEARNER_BOUND * 4.0 - 0.01)) == "turn"
    assert step_release("turn", True, _timing(busy=0.0, rollout=0.0)) == "turn"
    assert step_release("turn", False, _timing(busy=6.0)) == "turn"  # adaptive_turn_release=False
    for release in ("reward", "content"):  # only turn release adapts
        assert step_release(release, True, _timing(busy=6.0)) == release


def test_adaptive_turn_release_resumes_per_turn_only_well_below_the_bound():
    """After a step that ran as content release the bound is TURN_ENTRY (< LEARNER_BOUND): a content step busy for
    0.75 of its rollout stays content (released per turn it would cost ~1.3× and bound the step again)."""
    assert TURN_ENTRY < LEARNER_BOUND
    content_step = partial(_timing, turns_released=False)
    assert step_release("turn", True, content_step(busy=LEARNER_BOUND * 4.0)) == "content"
    assert step_release("turn", True, content_step(busy=TURN_ENTRY * 4.0)) == "content"
    assert step_release("turn", True, content_step(busy=TURN_ENTRY * 4.0 - 0.01)) == "turn"
    # a step that released per turn keeps doing so up to LEARNER_BOUND, as before
    assert step_release("turn", True, _timing(busy=(TURN_ENTRY + LEARNER_BOUND) / 2 * 4.0)) == "turn"
    # a timing that does not say (None) is read as a per-turn step
    assert step_release("turn", True, _timing(busy=LEARNER_BOUND * 4.0 - 0.01, turns_released=None)) == "turn"
