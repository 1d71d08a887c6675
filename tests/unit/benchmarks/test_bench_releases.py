"""Benchmark logic of issue 10: grading latency, release-point schedules and their predictions, overlap cost per side.

Hand-made traces with round numbers; no processes, no models, no sandbox, no timing.
"""

from __future__ import annotations

import statistics
import time

import pytest

from benchmarks.__main__ import parse_args, with_releases
from benchmarks.calibration import makespan, predicted_rollout
from benchmarks.stats import RunSteps, backward_slowdown_vs, compare, overlap_split, rollout_slowdown_vs, summarize
from benchmarks.workload import (
    _TRAJECTORY_KEY,
    ShellBenchEnv,
    Workload,
    command_for,
    env_factory,
    grading_seconds,
    split_schedule,
)
from trl_thundersync.trace.records import StepTrace, TraceEvent

# --- grading latency -------------------------------------------------------------------------------------------------


def test_grading_is_seeded_per_step_and_trajectory_with_its_own_spread():
    w = Workload(grading_latency=2.0, latency_cv=0.6, grading_cv=0.25, batch=8)
    assert grading_seconds(w, 3, 5) == grading_seconds(w.with_(latency_cv=1.0), 3, 5)  # not the tool spread
    assert grading_seconds(w, 3, 5) != grading_seconds(w, 4, 5) != grading_seconds(w, 4, 6)
    assert grading_seconds(w.with_(grading_cv=0.0), 3, 5) == 2.0
    draws = [grading_seconds(w, s, i) for s in range(200) for i in range(50)]
    assert statistics.fmean(draws) == pytest.approx(2.0, rel=0.02)
    assert statistics.pstdev(draws) / statistics.fmean(draws) == pytest.approx(0.25, abs=0.02)
    assert grading_seconds(w.with_(grading_latency=0.0), 3, 5) == 0.0


def test_the_environment_grades_from_the_end_of_its_last_turn():
    w = Workload(grading_latency=0.5, latency_mean=0.1, turns=2)
    cls = env_factory(w)
    assert cls.__name__ == "ShellBenchEnv" and issubclass(cls, ShellBenchEnv) and cls.workload is w
    # the episode's (step, trajectory) is read off the commands it runs
    assert _TRAJECTORY_KEY.search(command_for(w, 7, 13, 1)).groups() == ("7", "13", "1")
    env = cls.__new__(cls)  # no sandbox: only the reward path
    env.transcript, env._key, env._last_tool_end = ["task"], (7, 13), 100.0
    assert env._grading_deadline() == pytest.approx(100.0 + grading_seconds(w, 7, 13))
    env._last_tool_end = time.perf_counter() - 60.0  # graded long ago: no wait
    started = time.perf_counter()
    reward = env.get_reward()
    assert 0.0 <= reward < 1.0 and time.perf_counter() - started < 5.0
    plain = ShellBenchEnv.__new__(ShellBenchEnv)
    plain.transcript, plain._key, plain._last_tool_end = ["task"], (7, 13), 0.0
    assert plain._grading_deadline() is None and plain.get_reward() == reward  # the same hash reward


def test_makespan_adds_grading_after_the_slot_frees():
    # slots 2: A runs 1 (graded +0.5 → 1.5), B runs 2; the third (1 s) takes A at 1, ends 2, graded +3 → 5
    assert makespan([1.0, 2.0, 1.0], 2, [0.5, 0.0, 3.0]) == 5.0
    assert makespan([1.0, 2.0, 1.0], 2) == 2.0
    w = Workload(batch=4, group=2, concurrency=4, steps=2, latency_cv=0.0, turn_jitter=0.0, turns=1, grading_cv=0.0)
    assert predicted_rollout(w.with_(grading_latency=1.5), 1.0, 0.25) == pytest.approx(
        predicted_rollout(w, 1.0, 0.25) + 1.5)


# --- release-point schedules -----------------------------------------------------------------------------------------


def test_schedule_names_carry_the_release_point():
    assert split_schedule("thundersync:content") == ("thundersync", "content")
    assert split_schedule("thundersync") == ("thundersync", "reward")
    assert split_schedule("sync") == ("sync", "reward") and split_schedule("trl") == ("trl", "reward")
    for bad in ("sync:content", "fast", "trl:turn"):
        with pytest.raises(ValueError, match="unknown schedule"):
            split_schedule(bad)


def test_release_option_replaces_the_thundersync_schedule():
    assert with_releases(("sync", "thundersync", "trl"), ("reward", "content")) == (
        "sync", "thundersync:reward", "thundersync:content", "trl")
    assert with_releases(("sync", "thundersync", "trl"), None) == ("sync", "thundersync", "trl")
    assert with_releases(("sync", "trl"), ("content",)) == ("sync", "thundersync:content", "trl")
    assert with_releases(("sync", "thundersync:reward", "thundersync:content"), ("turn",)) == (
        "sync", "thundersync:turn")
    args = parse_args(["--preset", "quick", "--release", "reward,content,turn", "--grading-latency", "2"])
    assert args.release == ("reward", "content", "turn") and args.grading_latency == 2.0
    assert parse_args(["--reward-scope", "batch"]).reward_scope == "batch"
    assert Workload.from_dict(Workload(reward_scope="group").to_dict()).reward_scope == "group"
    with pytest.raises(SystemExit):
        parse_args(["--release", "late"])
    with pytest.raises(SystemExit):
        parse_args(["--schedules", "sync,thundersync:late"])


def _release_step(step, schedule, content_kind=False):
    """Two trajectories of one group, each 1 s of learner service: content-ready 1 and 2, rewards 3 and 4 (R = 4).

    sync: served after R (4→5, 5→6, fold 6→6.5); content release: 1→2, 2→3, binds at 3 and 4, fold 4→4.5."""
    t = 10.0 * step
    ev = [TraceEvent("rollout", "trajectory", t, t + 1.0, 0, 0), TraceEvent("rollout", "trajectory", t, t + 2.0, 1, 0)]
    if content_kind:
        ev += [TraceEvent("learner", "content_backward", t + 1.0, t + 2.0, 0, 0, ready=t + 1.0, content_ready=t + 1.0),
               TraceEvent("learner", "content_backward", t + 2.0, t + 3.0, 1, 0, ready=t + 2.0, content_ready=t + 2.0),
               TraceEvent("learner", "bind", t + 3.0, t + 3.0, 0, 0, ready=t + 3.0, content_ready=t + 1.0,
                          reward_at=t + 3.0),
               TraceEvent("learner", "bind", t + 4.0, t + 4.0, 1, 0, ready=t + 4.0, content_ready=t + 2.0,
                          reward_at=t + 4.0),
               TraceEvent("learner", "group_fold", t + 4.0, t + 4.5, group=0, ready=t + 4.0)]
        end = t + 4.5
    else:
        ev += [TraceEvent("learner", "source_backward", t + 4.0, t + 5.0, 0, 0, ready=t + 3.0, content_ready=t + 1.0,
                          reward_at=t + 3.0),
               TraceEvent("learner", "source_backward", t + 5.0, t + 6.0, 1, 0, ready=t + 4.0, content_ready=t + 2.0,
                          reward_at=t + 4.0),
               TraceEvent("learner", "group_fold", t + 6.0, t + 6.5, group=0, ready=t + 6.0)]
        end = t + 6.5
    return StepTrace(step=step, schedule=schedule, start=t, rollout_end=t + 4.0, learner_end=end, barrier_end=end,
                     publish_end=end, events=tuple(ev))


def _run(steps, wall):
    return RunSteps(walls=tuple(wall for _ in steps), traces=tuple(steps), peak_rss_mb=1.0,
                    peak_rss_with_children_mb=1.0, cpu_cores_used=1.0, foreign_cpu_cores=0.0)


def test_every_release_schedule_is_compared_with_its_own_replay_prediction():
    sync = [_release_step(k, "sync") for k in (1, 2)]
    content = [_release_step(k, "thundersync", content_kind=True) for k in (1, 2)]
    stats = {"sync": summarize([_run(sync, 6.5)]), "thundersync:content": summarize([_run(content, 4.5)])}
    # from the sync trace: reward release 3→4, 4→5, fold 5→5.5 (T 5.5); content 1→2, 2→3, fold 4→4.5 (T 4.5)
    assert stats["sync"].replay_release_s == pytest.approx({"reward": 5.5, "content": 4.5, "turn": 4.5})
    cmp = compare(stats, {"sync": sync, "thundersync:content": content})
    assert cmp.primary == "thundersync:content"
    assert cmp.predicted_from_sync == pytest.approx({"thundersync:content": 6.5 / 4.5})
    assert cmp.speedup["thundersync:content"] == pytest.approx(6.5 / 4.5)
    assert cmp.prediction_gaps["thundersync:content"] == pytest.approx(0.0)
    assert cmp.predicted_from_reward == {}  # no reward-release schedule in this comparison
    assert stats["thundersync:content"].learner_tail_s == pytest.approx(0.5)
    # content backwards ran before R, each as long as the same trajectory's in sync
    assert cmp.overlap_vs_sync["thundersync:content"]["backward_during_vs_sync"] == {
        "relative": 0.0, "seconds": 0.0, "pairs": 4}


# --- overlap cost, rollout side --------------------------------------------------------------------------------------


def _overlap_step(step, turn_len, tool_len, learner):
    """Trajectory 0: turn 0 [0, turn_len], tool [1, 1 + tool_len], turn 1 [3, 3 + turn_len]; learner items."""
    ev = [TraceEvent("rollout", "turn", 0.0, turn_len, 0, 0, turn=0),
          TraceEvent("tool", "tool_call", 1.0, 1.0 + tool_len, 0, 0),
          TraceEvent("rollout", "turn", 3.0, 3.0 + turn_len, 0, 0, turn=1)]
    ev += [TraceEvent("learner", "source_backward", a, b, 1, 0, ready=a) for a, b in learner]
    return StepTrace(step=step, schedule="x", start=0.0, rollout_end=5.0, learner_end=5.0, barrier_end=5.0,
                     publish_end=5.0, events=tuple(ev))


def test_rollout_work_is_split_by_learner_activity_and_paired_with_sync():
    # learner busy over [3, 4]: turn 1 (3→3.4) fully covered; turn 0 and the tool call (1→1.5) not at all
    ts = _overlap_step(1, 0.4, 0.5, [(3.0, 4.0)])
    busy, idle = overlap_split([ts], "rollout", "turn")
    assert busy == pytest.approx([0.4]) and idle == pytest.approx([0.4])
    busy, idle = overlap_split([ts], "tool", "tool_call")
    assert busy == [] and idle == pytest.approx([0.5])
    # partly covered (< half): neither busy nor idle
    half = _overlap_step(1, 0.4, 0.5, [(3.3, 4.0)])
    assert overlap_split([half], "rollout", "turn") == ([], pytest.approx([0.4]))
    # the same turn in sync took 0.2 s: +100%, +0.2 s; the tool call overlapping [1, 2] vs a 0.4 s sync one
    sync = _overlap_step(1, 0.2, 0.4, [])
    turns = rollout_slowdown_vs([sync], [ts], "rollout", "turn")
    assert (turns.relative, turns.seconds, turns.pairs) == (pytest.approx(1.0), pytest.approx(0.2), 1)
    tools = rollout_slowdown_vs([sync], [_overlap_step(1, 0.4, 0.5, [(1.0, 2.0)])], "tool", "tool_call")
    assert (tools.relative, tools.seconds, tools.pairs) == (pytest.approx(0.25), pytest.approx(0.1), 1)
    # other steps' work never pairs
    assert rollout_slowdown_vs([_overlap_step(2, 0.2, 0.4, [])], [ts], "rollout", "turn").pairs == 0


def test_backwards_before_r_are_paired_with_the_same_trajectory_in_sync():
    sync = [_release_step(1, "sync")]
    ts = _release_step(1, "thundersync", content_kind=True)
    slow = StepTrace(**{**ts.__dict__, "events": tuple(
        e if e.kind != "content_backward" or e.index != 1 else TraceEvent(
            "learner", "content_backward", e.start, e.start + 1.5, 1, 0, ready=e.ready) for e in ts.events)})
    paired = backward_slowdown_vs(sync, [slow])
    assert paired.pairs == 2 and paired.relative == pytest.approx(0.25) and paired.seconds == pytest.approx(0.25)


def test_markdown_renders_release_and_overlap_tables():
    from benchmarks.markdown import render

    sync = [_release_step(k, "sync") for k in (1, 2)]
    content = [_release_step(k, "thundersync", content_kind=True) for k in (1, 2)]
    reward = [_release_step(k, "thundersync") for k in (1, 2)]
    runs = {"sync": _run(sync, 6.5), "thundersync:reward": _run(reward, 6.5), "thundersync:content": _run(content, 4.5)}
    stats = {k: summarize([v]) for k, v in runs.items()}
    cmp = compare(stats, {k: list(v.traces) for k, v in runs.items()})
    assert cmp.primary == "thundersync:reward" and set(cmp.predicted_from_reward) == set(cmp.predicted_from_sync)
    report = {"command": "python -m benchmarks --preset quick-grading", "date": "2026-12-01",
              "seconds": 1.0, "points": [{"name": "g", "schedules": {k: v.to_dict() for k, v in stats.items()},
                                          "compare": cmp.to_dict()}]}
    text = render(report)
    assert "| g | thundersync:content | 4.50 | 1.44× | 1.44× |" in text
    assert "| g | thundersync:reward | 6.50 | 1.00× | 1.18× |" in text
    assert "backward ms during / after R" in text and "| g | thundersync:content | 1000 / – | +0% |" in text


def test_every_release_mode_is_predicted_from_the_sync_and_reward_traces():
    from benchmarks.markdown import mode_table
    from benchmarks.report import mode_predictions

    stats = {"sync": summarize([_run([_release_step(1, "sync")], 6.5)]),
             "thundersync:reward": summarize([_run([_release_step(1, "thundersync")], 6.5)])}
    modes = mode_predictions(stats)
    assert modes["sync"] == pytest.approx({"reward": 6.5 / 5.5, "content": 6.5 / 4.5, "turn": 6.5 / 4.5})
    assert set(modes) == {"sync", "thundersync:reward"}
    report = {"points": [{"name": "g", "schedules": {k: v.to_dict() for k, v in stats.items()}}]}
    assert "| g | sync | 1.18× | 1.44× | 1.44× |" in mode_table(report)
