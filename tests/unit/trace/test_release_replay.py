"""Eq. 14 replay of every GRPO release point (reward, content, turn) from one trace, on hand-computed cases."""

from __future__ import annotations

import dataclasses
import json

import pytest

from trl_thundersync.trace.export import read_jsonl
from trl_thundersync.trace.model import predict_release, predict_releases, release_items, trajectory_work
from trl_thundersync.trace.records import StepTrace, TraceEvent


def flat(pairs):
    return [x for pair in pairs for x in pair]


def sync_step(with_times: bool = True, t0: float = 50.0) -> StepTrace:
    """A sync trace of one group of two trajectories. Times are t0 + …

    traj 0: turns end 0.5 (10 action tokens) and 1.0 (30), content-ready 1.0, reward 2.0, service 1.0
    traj 1: turns end 2.0 and 3.0 (no token counts), content-ready 3.0, reward 4.0, service 2.0
    sync learner: traj 0 [4, 5], traj 1 [5, 7], fold [7, 7.1]; publish at 7.6 → R = 4, P = 0.5, L = 3.1
    """
    def extra(index):
        if not with_times:
            return {}
        return {"content_ready": t0 + (1.0, 3.0)[index], "reward_at": t0 + (2.0, 4.0)[index]}

    ev = [
        TraceEvent("rollout", "trajectory", t0, t0 + 1.0, index=0, group=0),
        TraceEvent("rollout", "turn", t0, t0 + 0.5, index=0, group=0, turn=0, tokens=10),
        TraceEvent("rollout", "turn", t0 + 0.6, t0 + 1.0, index=0, group=0, turn=1, tokens=30),
        TraceEvent("rollout", "reward", t0 + 1.0, t0 + 2.0, index=0, group=0),
        TraceEvent("rollout", "trajectory", t0, t0 + 3.0, index=1, group=0),
        TraceEvent("rollout", "turn", t0, t0 + 2.0, index=1, group=0, turn=0),
        TraceEvent("rollout", "turn", t0 + 2.5, t0 + 3.0, index=1, group=0, turn=1),
        TraceEvent("rollout", "reward", t0 + 3.0, t0 + 4.0, index=1, group=0),
        TraceEvent("learner", "source_backward", t0 + 4.0, t0 + 5.0, index=0, group=0, ready=t0 + 2.0, **extra(0)),
        TraceEvent("learner", "source_backward", t0 + 5.0, t0 + 7.0, index=1, group=0, ready=t0 + 4.0, **extra(1)),
        TraceEvent("learner", "group_fold", t0 + 7.0, t0 + 7.1, group=0, ready=t0 + 7.0),
        TraceEvent("barrier", "optimizer", t0 + 7.1, t0 + 7.6),
    ]
    return StepTrace(step=1, schedule="sync", start=t0, rollout_end=t0 + 4.0, learner_end=t0 + 7.1,
                     barrier_end=t0 + 7.6, publish_end=t0 + 7.6, events=tuple(ev))


# Worked by hand (relative to t0), c_j = max(τ_j, c_{j−1}) + p_j:
#   reward:  (2, 1) (4, 2) (4, .1)                          → 3, 6, 6.1          T = 6.1 + .5 = 6.6
#   content: (1, 1) (2, 0) (3, 2) (4, 0) (4, .1)            → 2, 2, 5, 5, 5.1    T = 5.6
#   turn:    (.5, .25) (1, .75) (2, 0) (2, 1) (3, 1) (4, 0) (4, .1)
#                                                           → .75, 1.75, 2, 3, 4, 4, 4.1   T = 4.6
#   sync: R + L + P = 4 + 3.1 + .5 = 7.6
EXPECTED = {"reward": 6.6, "content": 5.6, "turn": 4.6}


@pytest.mark.parametrize("with_times", [True, False], ids=["item-times", "old-trace-rollout-lane"])
def test_every_release_point_from_one_sync_trace(with_times):
    step = sync_step(with_times)
    for mode, expected in EXPECTED.items():
        rep = predict_release(step, mode)
        assert rep.thundersync_time == pytest.approx(expected), mode
        assert rep.sync_time == pytest.approx(7.6)
        assert rep.speedup == pytest.approx(7.6 / expected)
        assert rep.learner_service == pytest.approx(3.1)
        assert rep.rollout_end == pytest.approx(4.0) and rep.suffix == pytest.approx(0.5)
    assert predict_release(step, "content").learner_tail == pytest.approx(1.1)
    assert predict_release(step, "turn").learner_tail == pytest.approx(0.1)
    assert set(predict_releases(step)) == {"reward", "content", "turn"}


def test_turn_split_follows_action_tokens_or_is_even():
    work = trajectory_work(sync_step(t0=0.0))
    assert flat(work[0].turns) == pytest.approx(flat([(0.5, 0.25), (1.0, 0.75)]))
    assert flat(work[1].turns) == pytest.approx(flat([(2.0, 1.0), (3.0, 1.0)]))
    assert (work[0].content_ready, work[0].reward_at, work[0].service) == (1.0, 2.0, 1.0)


def test_a_content_release_trace_replays_reward_release_with_its_binds():
    """traj 0's backward ran at content readiness (0.5 s) and its bind (0.2 s) at the reward."""
    t0 = 0.0
    ev = [
        TraceEvent("rollout", "trajectory", 0.0, 1.0, index=0, group=0),
        TraceEvent("learner", "content_backward", 1.0, 1.5, index=0, group=0, ready=1.0, content_ready=1.0),
        TraceEvent("learner", "bind", 3.0, 3.2, index=0, group=0, ready=3.0, content_ready=1.0, reward_at=3.0),
        TraceEvent("learner", "group_fold", 3.2, 3.3, group=0, ready=3.2),
    ]
    step = StepTrace(step=0, schedule="thundersync", start=t0, rollout_end=3.0, learner_end=3.3, barrier_end=3.5,
                     publish_end=3.5, events=tuple(ev))
    assert flat(release_items(step, "content")) == pytest.approx(flat([(1.0, 0.5), (3.0, 0.2), (3.0, 0.1)]))
    assert flat(release_items(step, "reward")) == pytest.approx(flat([(3.0, 0.7), (3.0, 0.1)]))
    assert predict_release(step, "reward").thundersync_time == pytest.approx(3.8 + 0.2)
    assert predict_release(step, "content").thundersync_time == pytest.approx(3.3 + 0.2)
    # no turn information: "turn" releases as "content"
    assert release_items(step, "turn") == release_items(step, "content")


def test_a_turn_release_trace_uses_its_own_turn_items():
    ev = [
        TraceEvent("rollout", "trajectory", 0.0, 2.0, index=0, group=0),
        TraceEvent("learner", "turn_backward", 1.0, 1.3, index=0, group=0, turn=0, ready=1.0),
        TraceEvent("learner", "turn_backward", 2.0, 2.1, index=0, group=0, turn=1, ready=1.9),
        TraceEvent("learner", "turn_close", 2.1, 2.5, index=0, group=0, ready=2.0, content_ready=2.0),
        TraceEvent("learner", "bind", 4.0, 4.1, index=0, group=0, ready=4.0, content_ready=2.0, reward_at=4.0),
        TraceEvent("learner", "group_fold", 4.1, 4.2, group=0, ready=4.1),
    ]
    step = StepTrace(step=0, schedule="thundersync", start=0.0, rollout_end=4.0, learner_end=4.2, barrier_end=4.2,
                     publish_end=4.2, events=tuple(ev))
    assert flat(release_items(step, "turn")) == pytest.approx(flat([(1.0, 0.3), (1.9, 0.1), (2.0, 0.4), (4.0, 0.1),
                                                         (4.0, 0.1)]))
    assert flat(release_items(step, "content")) == pytest.approx(flat([(2.0, 0.8), (4.0, 0.1), (4.0, 0.1)]))
    assert flat(release_items(step, "reward")) == pytest.approx(flat([(4.0, 0.9), (4.0, 0.1)]))


def test_unknown_mode_and_missing_times_are_refused():
    with pytest.raises(ValueError, match="mode='late'"):
        predict_release(sync_step(), "late")
    bare = StepTrace(step=3, schedule="sync", start=0.0, rollout_end=1.0, learner_end=1.5, barrier_end=1.5,
                     publish_end=1.5, events=(TraceEvent("learner", "content_backward", 1.0, 1.5, index=2, group=1),))
    with pytest.raises(ValueError, match="step 3: trajectory 2"):
        predict_release(bare, "content")


def test_traces_without_the_new_fields_still_load(tmp_path):
    step = sync_step(with_times=False)
    record = dataclasses.asdict(step)
    for e in record["events"]:
        del e["content_ready"], e["reward_at"]
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(record) + "\n")
    loaded = read_jsonl(path)[0]
    assert loaded == step
    assert predict_release(loaded, "content").thundersync_time == pytest.approx(EXPECTED["content"])
