"""bench/realgen.py's pure logic: the overlap bound and the per-schedule table (no runs)."""

from types import SimpleNamespace

import pytest

from benchmarks.realgen import bound, format_rows, parse_args, realgen_rows
from benchmarks.stats import Comparison


def test_bound_is_one_plus_rho_over_max_one_rho():
    assert bound(0.0) == 1.0
    assert bound(0.45) == pytest.approx(1.45)
    assert bound(1.0) == 2.0
    assert bound(4.0) == pytest.approx(1.25)
    with pytest.raises(ValueError):
        bound(-0.1)


def _summary(wall, rollout, learner, tail, turn_busy=None):
    return SimpleNamespace(step_wall_s=wall, rollout_s=rollout, learner_busy_s=learner,
                           balance_ratio=learner / rollout, learner_tail_s=tail, turn_busy_s=turn_busy,
                           turn_idle_s=None)


def test_rows_use_the_sync_rho_for_the_bound_and_leave_the_distillation_run_out_of_speedups():
    stats = {"sync": _summary(10.0, 8.0, 2.0, 2.0), "thundersync:content": _summary(8.0, 8.0, 2.0, 0.2, 1.0),
             "gkd": _summary(6.0, 5.0, 1.0, 0.5)}
    cmp = Comparison(speedup={"sync": 1.0, "thundersync:content": 1.25}, predicted_speedup=1.2,
                     measured_speedup_step=1.25, measured_speedup_trace=1.25, prediction_gap=0.04,
                     primary="thundersync:content", predicted_from_sync={"thundersync:content": 1.2},
                     overlap_vs_sync={"thundersync:content": {
                         "turn_busy_vs_sync": {"relative": 0.08, "seconds": 0.1, "pairs": 5}}})
    rows = {r["schedule"]: r for r in realgen_rows(stats, cmp)}
    assert rows["sync"]["bound"] == pytest.approx(1.25)  # ρ = 2/8 from the sync runs
    assert rows["thundersync:content"]["of_bound"] == pytest.approx(1.0)
    assert rows["thundersync:content"]["tail_frac"] == pytest.approx(0.2 / 8.0)
    assert rows["thundersync:content"]["turn_busy_vs_sync"] == 0.08
    assert rows["thundersync:content"]["prediction_gap"] == pytest.approx(1.25 / 1.2 - 1)
    assert rows["gkd"]["speedup"] is None and rows["gkd"]["bound"] is None and rows["gkd"]["tail_s"] == 0.5
    lines = format_rows(list(rows.values()), stats["sync"].balance_ratio)
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|")
    assert "+8.0% (+100.0 ms, n=5)" in lines[3]


def test_schedules_are_checked():
    assert parse_args(["--schedules", "sync,gkd"]).schedules == ("sync", "gkd")
    with pytest.raises(SystemExit):
        parse_args(["--schedules", "sync,thundersync:late"])


def test_distillation_traces_are_summarized_without_release_replay():
    """A ThunderSyncGKDTrainer trace has no rewards: stats.summarize (which replays the GRPO release points) refuses
    it, summarize_distill gives R, L, ρ and the tail."""
    from benchmarks.realgen import summarize_distill
    from benchmarks.stats import RunSteps, summarize
    from trl_thundersync.trace.records import StepTrace, TraceEvent

    events = (TraceEvent("rollout", "trajectory", 0.0, 2.0, index=0),
              TraceEvent("rollout", "turn", 0.0, 1.0, index=0, turn=0),
              TraceEvent("learner", "turn_backward", 1.0, 1.5, index=0, turn=0, ready=1.0),
              TraceEvent("learner", "context_replay", 2.0, 2.5, index=0, ready=2.0),
              TraceEvent("barrier", "optimizer", 2.5, 2.6))
    step = StepTrace(step=1, schedule="thundersync", start=0.0, rollout_end=2.0, learner_end=2.5, barrier_end=2.6,
                     publish_end=2.6, events=events)
    run = RunSteps(walls=(2.6,), traces=(step,), peak_rss_mb=1.0, peak_rss_with_children_mb=1.0, cpu_cores_used=1.0,
                   foreign_cpu_cores=0.0)
    with pytest.raises(ValueError):
        summarize([run])
    s = summarize_distill([run])
    assert (s.rollout_s, s.learner_busy_s, s.learner_tail_s) == pytest.approx((2.0, 1.0, 0.5))
    assert s.balance_ratio == pytest.approx(0.5)


def test_episode_rows_report_step_one_and_all_steps_per_grpo_schedule():
    from benchmarks.realgen import episode_log, episode_rows, format_episode_rows

    history = [{"loss": 0.1, "completions/mean_length": 70.0, "completions/max_length": 120.0,
                "completions/clipped_ratio": 0.0, "tools/call_frequency": 1.0, "step_time": 1.0},
               {"train_runtime": 5.0},  # the end-of-training entry has no completion metrics
               {"completions/mean_length": 90.0, "tools/call_frequency": 2.0}]
    log = episode_log(history)
    assert log == [{"completions/mean_length": 70.0, "completions/max_length": 120.0,
                    "completions/clipped_ratio": 0.0, "tools/call_frequency": 1.0},
                   {"completions/mean_length": 90.0, "tools/call_frequency": 2.0}]
    runs = {"sync": [{"episodes": log}, {"episodes": [{"completions/mean_length": 80.0,
                                                       "tools/call_frequency": 1.5}]}],
            "trl": [{}],  # a report from before this field: skipped
            "gkd": [{"episodes": log}]}  # not a GRPO episode: skipped
    rows = episode_rows(runs)
    assert [r["schedule"] for r in rows] == ["sync"]
    row = rows[0]
    assert row["runs"] == 2 and row["step1_model_tokens"] == pytest.approx(75.0)
    assert row["model_tokens"] == pytest.approx(80.0) and (row["model_tokens_min"], row["model_tokens_max"]) == (70, 90)
    assert row["tool_calls"] == pytest.approx(1.5)
    lines = format_episode_rows(rows)
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|")
    assert "| sync | 2 | 75.0 | 80.0 (70.0–90.0) | 1.50 |" == lines[2]
