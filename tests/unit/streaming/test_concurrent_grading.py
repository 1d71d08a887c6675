"""`grading_workers`: environments' `get_reward` graded concurrently from delivery on (fakes, no model).

Environments here block in `get_reward` on a barrier that only k concurrent callers pass (with a timeout, so serial
grading fails instead of hanging). Values, user calls and errors are compared with serial grading (workers=1).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest
import torch

from trl_thundersync import ThunderSyncGRPOConfig
from trl_thundersync.errors import ConfigurationError, RewardFunctionError
from trl_thundersync.streaming.grading import available_cores, grading_workers
from trl_thundersync.streaming.learner import GRPOBatchLearner, SourceGradients
from trl_thundersync.streaming.pipeline import run_logical_batch
from trl_thundersync.streaming.reward_scope import REWARD_SCOPES, RewardStage, ScopeProbe
from trl_thundersync.streaming.rewards import RewardContext, RewardScorer, ScoringInput
from trl_thundersync.types import Rollout, RolloutRequest, ScoredRollout

G, B, P = 2, 6, 4
ARRIVAL = [3, 0, 5, 2, 1, 4]  # completion order of the fake engine
WAIT = 20.0  # seconds a barrier waits for its other callers before the test fails


class GradedEnv:
    """An environment whose `get_reward` waits at `barrier` (if any) and records who graded it and when."""

    barrier: threading.Barrier | None = None
    failing: int | None = None  # the index whose get_reward raises

    def __init__(self, index: int) -> None:
        self.index = index
        self.grading = False
        self.graded_at: float | None = None
        self.graded_by: str | None = None

    def get_reward(self) -> float | None:
        self.grading = True
        try:
            if self.barrier is not None:
                self.barrier.wait(timeout=WAIT)  # BrokenBarrierError (→ RewardFunctionError) if nobody else comes
            if self.index == self.failing:
                raise ValueError(f"tests of trajectory {self.index} crashed")
            self.graded_by = threading.current_thread().name
            return None if self.index == 4 else 0.25 * self.index - 0.5
        finally:
            self.graded_at = time.perf_counter()
            self.grading = False


class OtherEnv(GradedEnv):
    """A second environment class (TRL: a second `get_reward` column, None on the other class's rows)."""


def trl_env_reward(env_type):
    """TRL 1.16's wrapper (GRPOTrainer.__init__), verbatim: one column per environment class with `get_reward`."""
    def get_reward(environments, _env_type=env_type, **kwargs):
        return [e.get_reward() if type(e) is _env_type else None for e in environments]
    return get_reward


def trl_async_env_reward(env_type):
    async def get_reward(environments, _env_type=env_type, **kwargs):
        return [await e.get_reward() if type(e) is _env_type else None for e in environments]
    return get_reward


class UserReward:
    """A plain user reward function (`relative`: centred lengths, else lengths) that records its calls and thread."""

    __name__ = "user"

    def __init__(self, relative: bool = True) -> None:
        self.relative = relative
        self.calls: list[dict] = []
        self.threads: set[str] = set()

    def __call__(self, prompts, completions, completion_ids, environments, **kwargs):
        self.threads.add(threading.current_thread().name)
        assert not any(e.grading for e in environments), "a user function saw an environment being graded"
        self.calls.append(dict(prompts=prompts, completions=completions, completion_ids=completion_ids,
                               environments=[e.index for e in environments], answer=kwargs["answer"]))
        mean = sum(len(c) for c in completions) / len(completions) if self.relative else 0.0
        return [len(c) - mean for c in completions]


def rollout(i: int) -> Rollout:
    return Rollout(index=i, group=i // G, policy_version=0, prompt_ids=(1,), completion_ids=(5,) * (i + 1),
                   completion="x" * (i + 1), finished_at=time.perf_counter())


class FakeEngine:
    """Delivers the batch's trajectories at once, in `ARRIVAL` order."""

    def start_batch(self, requests, policy_version):
        self.requests = {r.index: r for r in requests}

    def results(self):
        for i in ARRIVAL:
            yield rollout(i)


class Backward:
    def __call__(self, source: ScoredRollout, bucket: int) -> SourceGradients:
        return self.content(source.rollout, bucket)

    def content(self, r: Rollout, bucket: int) -> SourceGradients:
        return SourceGradients(torch.randn(P, generator=torch.Generator().manual_seed(r.index)), None, 3)


def learner(release: str) -> GRPOBatchLearner:
    backward = Backward()
    return GRPOBatchLearner(batch_size=B, num_generations=G, num_params=P, policy_version=0, scale_rewards="group",
                            source_backward=backward, release=release, content_backward=backward.content,
                            allow_unscorable_groups=True)


def stage(scope, workers, envs, *, env_rewards=None, loop=None, user=None):
    user = user or UserReward()
    env_rewards = env_rewards or [trl_env_reward(GradedEnv), trl_env_reward(OtherEnv)]
    funcs = [user, *env_rewards]
    names, weights = ["user", "GradedEnv", "OtherEnv"][:len(funcs)], torch.tensor([1.0, 2.0, 3.0][:len(funcs)])
    scorer = RewardScorer(funcs, names, weights, async_loop=loop)

    def prepare(r):
        return ScoringInput(r, f"prompt{r.group}", {"prompt": "p", "answer": f"a{r.index}"}, envs[r.index])

    context = RewardContext(trainer_state="state", log_extra=lambda c, rows, v: None, log_metric=lambda n, v: None)
    return RewardStage(scorer, scope, batch_size=B, num_generations=G, prepare=prepare, context=context,
                       probe=ScopeProbe([0]) if scope == "auto" else None,
                       environment_rewards=range(1, len(funcs)), grading_workers=workers), user


def environments(barrier=None, failing=None):
    kinds = [GradedEnv, GradedEnv, OtherEnv, GradedEnv, GradedEnv, OtherEnv]
    envs = [kind(i) for i, kind in enumerate(kinds)]
    for e in envs:
        e.barrier, e.failing = barrier, failing
    return envs


def run_batch(scope, workers, envs, schedule="thundersync", release="content", **kw):
    # under "auto" a batch-relative user function would trip the probe: it gets per-sample values there
    st, user = stage(scope, workers, envs, user=UserReward(relative=scope != "auto"), **kw)
    seen: list[ScoredRollout] = []
    requests = [RolloutRequest(i, i // G, (1,), seed=i) for i in range(B)]
    try:
        totals, timing = run_logical_batch(FakeEngine(), requests, 0, st.add, learner(release), schedule,
                                           on_source=seen.append, grade=st.start if st.grades_ahead else None)
    finally:
        st.close()
    return sorted(seen, key=lambda s: s.rollout.index), user, timing


def grading_threads():
    return [t for t in threading.enumerate() if t.name.startswith("thundersync-grading")]


def values(scored):
    """(index, rewards per function, reward) with NaN as None, so that equal rows compare equal."""
    def plain(v):
        return None if math.isnan(v) else v
    return [(s.rollout.index, tuple(map(plain, s.rewards_per_func)), plain(s.reward)) for s in scored]


MODES = [("thundersync", "content"), ("thundersync", "reward"), ("sync", "content")]


@pytest.mark.parametrize("schedule, release", MODES)
@pytest.mark.parametrize("scope", REWARD_SCOPES)
def test_environments_are_graded_concurrently_with_the_values_of_serial_grading(scope, schedule, release):
    serial, serial_user, _ = run_batch(scope, 1, environments(), schedule, release)
    envs = environments(threading.Barrier(3, timeout=WAIT))  # needs 3 get_reward calls at once, twice per batch
    graded, user, timing = run_batch(scope, 3, envs, schedule, release)
    assert values(graded) == values(serial)
    assert math.isnan(graded[4].rewards_per_func[1]) and math.isnan(graded[0].rewards_per_func[2])
    assert user.calls == serial_user.calls  # the same user calls, in the same order, with the same arguments
    assert len(user.threads) == 1 and not any(t.startswith("thundersync-grading") for t in user.threads)
    assert {e.graded_by.rsplit("_", 1)[0] for e in envs if e.graded_by} == {"thundersync-grading"}
    for s in graded:  # a reward is known once its environment is graded, and R is the last one
        assert s.scored_at >= envs[s.rollout.index].graded_at
    assert timing.rollout_end == max(s.scored_at for s in graded)
    assert not grading_threads()


def test_serial_grading_calls_get_reward_on_the_scoring_thread_after_the_user_function():
    order = []

    class Ordered(GradedEnv):
        def get_reward(self):
            order.append(("env", self.index, threading.current_thread().name))
            return 1.0

    user = UserReward()
    original = user.__call__

    def recorded(**kw):
        order.append(("user", kw["completions"][0].count("x") - 1, threading.current_thread().name))
        return original(**kw)

    envs = [Ordered(i) for i in range(B)]
    st, _ = stage("trajectory", 1, envs, env_rewards=[trl_env_reward(Ordered)], user=recorded)
    assert not st.grades_ahead
    requests = [RolloutRequest(i, i // G, (1,), seed=i) for i in range(B)]
    run_logical_batch(FakeEngine(), requests, 0, st.add, learner("content"), grade=None)
    st.close()
    assert [(kind, i) for kind, i, _ in order] == [(k, i) for i in ARRIVAL for k in ("user", "env")]
    assert {name for *_, name in order} == {"thundersync-scoring"}
    assert not grading_threads()


@pytest.mark.parametrize("scope", REWARD_SCOPES)
def test_a_get_reward_that_raises_names_the_function_and_the_trajectory_and_leaves_no_thread(scope):
    with pytest.raises(RewardFunctionError, match=r"reward function 'GradedEnv' raised ValueError: tests of "
                                                  r"trajectory 3 crashed on trajectory 3 \(group 1\)"):
        run_batch(scope, 3, environments(failing=3))
    assert not grading_threads()


@pytest.mark.parametrize("failure", [RuntimeError, KeyboardInterrupt])  # a learner failure, Ctrl-C
def test_an_aborted_batch_cancels_waiting_gradings_and_leaves_no_thread(failure):
    class Slow(GradedEnv):
        calls = 0

        def get_reward(self):
            type(self).calls += 1
            time.sleep(0.05)
            return 0.0

    def failing_content(r, bucket):
        raise failure("learner failed")

    st, _ = stage("batch", 2, [Slow(i) for i in range(B)], env_rewards=[trl_env_reward(Slow)])
    batch_learner = learner("content")
    batch_learner.content_backward = failing_content
    requests = [RolloutRequest(i, i // G, (1,), seed=i) for i in range(B)]
    with pytest.raises(failure, match="learner failed"):
        try:
            run_logical_batch(FakeEngine(), requests, 0, st.add, batch_learner, grade=st.start)
        finally:
            st.close()
    assert not grading_threads()
    assert not batch_learner.buffered


@pytest.mark.parametrize("scope", ["trajectory", "group", "batch"])
def test_an_async_get_reward_runs_concurrently_on_the_trainers_event_loop(scope):
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    gate = asyncio.Barrier(3)

    class AsyncEnv(GradedEnv):
        async def get_reward(self):
            await asyncio.wait_for(gate.wait(), timeout=WAIT)
            return 0.5 * self.index

    try:
        graded, _, _ = run_batch(scope, 3, [AsyncEnv(i) for i in range(B)], loop=loop,
                                 env_rewards=[trl_async_env_reward(AsyncEnv)])
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
    assert [s.rewards_per_func[1] for s in graded] == [0.5 * i for i in range(B)]


def test_default_workers_are_bounded_by_cores_eight_and_the_batch(tmp_path):
    assert grading_workers(None, 64) == min(2 * available_cores(), 8)
    assert grading_workers(None, 1) == 1 and grading_workers(16, 4) == 4 and grading_workers(1, 64) == 1
    base = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=4,
                num_generations=2)
    assert ThunderSyncGRPOConfig(**base).grading_workers is None
    with pytest.raises(ConfigurationError, match="grading_workers=0 must be ≥ 1"):
        ThunderSyncGRPOConfig(**base, grading_workers=0)
