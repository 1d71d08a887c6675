"""Pure logic of the benchmark: seeded latencies, slot scheduling and calibration, aggregation and prediction.

Hand-made traces with round numbers; no processes, no models, no timing.
"""

from __future__ import annotations

import random
import statistics

import pytest

from benchmarks.__main__ import parse_args
from benchmarks.affinity import split_cores
from benchmarks.calibration import calibrated_latency_mean, calibration_from_probe, makespan, predicted_rollout
from benchmarks.report import gap_lines, learner_thread_lines
from benchmarks.stats import RunSteps, compare, measured_run, predict_thundersync, side_by_side, summarize
from benchmarks.workload import Workload, _lognormal, command_for, tool_latency, trajectory_latency_units
from trl_thundersync.trace.records import StepTrace, TraceEvent

# --- seeded latencies ------------------------------------------------------------------------------------------------


def test_lognormal_draws_have_mean_one_and_the_requested_cv():
    rng = random.Random(0)
    xs = [_lognormal(rng, 0.6) for _ in range(40_000)]
    # 40k draws: the standard error of the mean is 0.6/200 = 0.003; of the CV about 0.01. Tolerances are 3-5x that.
    assert statistics.fmean(xs) == pytest.approx(1.0, abs=0.015)
    assert statistics.pstdev(xs) / statistics.fmean(xs) == pytest.approx(0.6, abs=0.05)
    assert _lognormal(rng, 0.0) == 1.0


def test_latencies_are_seeded_per_step_trajectory_and_turn():
    w = Workload(latency_mean=0.5, latency_cv=0.8, turns=3, batch=8, group=4)
    assert tool_latency(w, 2, 5, 1) == tool_latency(w, 2, 5, 1)
    assert tool_latency(w, 2, 5, 1) != tool_latency(w, 3, 5, 1)
    assert tool_latency(w.with_(seed=1), 2, 5, 1) != tool_latency(w, 2, 5, 1)
    units = trajectory_latency_units(w, 2)
    assert len(units) == 8
    assert sum(tool_latency(w, 2, 5, t) for t in range(3)) == pytest.approx(0.5 * units[5])
    assert command_for(w, 2, 5, 1).startswith(f"sleep {tool_latency(w, 2, 5, 1):.4f} && ")


def test_workload_round_trips_through_a_dict_and_rejects_unknown_fields():
    w = Workload(name="x", batch=8, latency_cv=1.0)
    assert Workload.from_dict(w.to_dict()) == w
    with pytest.raises(ValueError, match="not_a_knob"):
        Workload.from_dict({**w.to_dict(), "not_a_knob": 3})


# --- slot scheduling and calibration ---------------------------------------------------------------------------------


def test_makespan_is_fifo_list_scheduling_on_the_slots():
    # slots 2: [4 | 1, 2] -> slot A runs 4; slot B runs 1 then 2 (ends 3), then the 3 goes to B at 3 -> ends 6
    assert makespan([4.0, 1.0, 2.0, 3.0], 2) == 6.0
    assert makespan([4.0, 1.0, 2.0, 3.0], 4) == 4.0
    assert makespan([4.0, 1.0, 2.0, 3.0], 1) == 10.0
    assert makespan([], 3) == 0.0


def test_calibrated_latency_mean_hits_the_target_rollout_time():
    w = Workload(batch=16, group=4, turns=2, concurrency=4, latency_cv=0.6, balance=0.8, steps=4)
    learner, overhead = 0.1, 0.05
    mean = calibrated_latency_mean(w, learner, overhead)
    target = 16 * learner / 0.8
    assert predicted_rollout(w, mean, overhead) == pytest.approx(target, rel=1e-6)
    # ρ = 2 halves R; a per-batch fixed cost is taken off the slot schedule's target
    mean2 = calibrated_latency_mean(w.with_(balance=2.0), learner, overhead, rollout_fixed=0.1)
    assert predicted_rollout(w, mean2, overhead) == pytest.approx(16 * learner / 2.0 - 0.1, rel=1e-6)


def test_calibration_returns_zero_latency_when_the_overhead_alone_is_too_slow():
    w = Workload(batch=16, group=4, concurrency=1, balance=4.0)
    assert calibrated_latency_mean(w, learner_per_trajectory=0.01, overhead_per_trajectory=1.0) == 0.0
    with pytest.raises(ValueError, match="balance"):
        calibrated_latency_mean(w.with_(balance=None), 0.1, 0.1)


def _step(step, schedule, start, rollout_end, items, publish_gap=0.5, trajectories=(), stats_bytes=0):
    """A trace with learner items (kind, ready, start, end) and trajectories (start, end)."""
    events = [TraceEvent("rollout", "trajectory", a, b, i, i // 2) for i, (a, b) in enumerate(trajectories)]
    events += [TraceEvent("learner", kind, s, e, ready=r, flops=1e12 if kind == "source_backward" else 0.0)
               for kind, r, s, e in items]
    learner_end = max((e for *_, e in items), default=rollout_end)
    end = max(learner_end, rollout_end) + publish_gap
    return StepTrace(step=step, schedule=schedule, start=start, rollout_end=rollout_end, learner_end=learner_end,
                     barrier_end=end, publish_end=end, events=tuple(events), stats_bytes=stats_bytes)


def test_calibration_from_probe_reads_learner_cost_and_overhead():
    w = Workload(batch=4, group=2, concurrency=2, steps=2)
    # one backward slowed 6x by another process: the median ignores it; the fold's 0.2 s is shared by 4
    items = [("source_backward", 1.0, 2.0, 2.5), ("source_backward", 1.0, 2.5, 3.0),
             ("source_backward", 1.5, 3.0, 6.0), ("source_backward", 2.0, 6.0, 6.5), ("group_fold", 6.5, 6.5, 6.7)]
    probe = _step(1, "sync", 0.0, 2.5, items, trajectories=[(0, 1), (0, 1), (1, 2), (1, 2)])
    cal = calibration_from_probe(w, [probe])
    assert cal.learner_per_trajectory_s == pytest.approx(0.5 + 0.2 / 4)
    assert cal.overhead_per_trajectory_s == pytest.approx(1.0)
    assert cal.rollout_without_latency_s == pytest.approx(2.5)
    assert cal.rollout_fixed_s == pytest.approx(0.5)  # 4 × 1 s on 2 slots = 2 s; measured 2.5 s


# --- prediction and aggregation --------------------------------------------------------------------------------------


def test_prediction_from_a_sync_trace_releases_items_at_their_ready_times():
    # Sync served everything after R = 4: items ready at 1, 2, 3 (p = 1 each) and a fold it reached at 7.
    sync = _step(0, "sync", 0.0, 4.0, [("source_backward", 1.0, 4.0, 5.0), ("source_backward", 2.0, 5.0, 6.0),
                                       ("source_backward", 3.0, 6.0, 7.0), ("group_fold", 7.0, 7.0, 7.5)],
                 publish_gap=0.5)
    rep = predict_thundersync(sync)
    # lane: 1→2, 2→3, 3→4, fold 4→4.5 (released with its members, not at 7); T = max(4, 4.5) + 0.5
    assert rep.completions == pytest.approx((2.0, 3.0, 4.0, 4.5))
    assert rep.thundersync_time == pytest.approx(5.0)
    assert rep.sync_time == pytest.approx(4.0 + 3.5 + 0.5)
    assert rep.speedup == pytest.approx(8.0 / 5.0)


def test_summaries_drop_warm_up_and_compare_with_the_prediction():
    result = {"peak_rss_mb": {"self": 100.0, "total": 150.0}, "cpu_cores_used": 0.9, "foreign_cpu_cores": 0.1}
    warm = _step(0, "sync", 0.0, 9.0, [("source_backward", 1.0, 9.0, 20.0)])
    sync_steps = [_step(k, "sync", 10.0 * k, 10.0 * k + 4.0,
                        [("source_backward", 10.0 * k + 2.0, 10.0 * k + 4.0, 10.0 * k + 6.0),
                         ("source_backward", 10.0 * k + 4.0, 10.0 * k + 6.0, 10.0 * k + 8.0)], publish_gap=0.0,
                        stats_bytes=2**20) for k in (1, 2)]
    ts_steps = [_step(k, "thundersync", 10.0 * k, 10.0 * k + 4.0,
                      [("source_backward", 10.0 * k + 2.0, 10.0 * k + 2.0, 10.0 * k + 4.0),
                       ("source_backward", 10.0 * k + 4.0, 10.0 * k + 4.0, 10.0 * k + 6.0)], publish_gap=0.0)
                for k in (1, 2)]
    sync = measured_run([99.0, 8.0, 8.0], [warm, *sync_steps], result)
    ts = measured_run([99.0, 6.0, 6.0], [warm, *ts_steps], result)
    assert isinstance(sync, RunSteps) and sync.walls == (8.0, 8.0)
    stats = {"sync": summarize([sync], peak_flops=1e12), "thundersync": summarize([ts])}
    s = stats["sync"]
    assert (s.steps, s.step_wall_s, s.rollout_s, s.learner_busy_s, s.balance_ratio) == (2, 8.0, 4.0, 4.0, 1.0)
    assert s.learner_idle_fraction == pytest.approx(0.5) and s.learner_tail_s == pytest.approx(4.0)
    assert s.learner_tflops_per_s == pytest.approx(2.0 / 8.0) and s.mfu == pytest.approx(0.25)
    assert s.stats_peak_mb == 1.0 and s.peak_rss_mb == 100.0 and s.replay_abs_error == pytest.approx(0.0)
    assert stats["thundersync"].mfu is None and stats["thundersync"].learner_idle_fraction == pytest.approx(1 / 3)
    # thundersync: the backward 2→4 ran before R = 4, the one 4→6 after it; sync ran both after R
    assert (stats["thundersync"].backward_during_rollout_s, stats["thundersync"].backward_after_rollout_s) == (2.0, 2.0)
    assert (s.backward_during_rollout_s, s.backward_after_rollout_s) == (None, 2.0)
    cmp = compare(stats)
    assert cmp.speedup == pytest.approx({"sync": 1.0, "thundersync": 8.0 / 6.0})
    assert cmp.predicted_speedup == pytest.approx(8.0 / 6.0)  # lane from the sync trace: 2→4, 4→6
    assert cmp.prediction_gap == pytest.approx(0.0)
    with pytest.raises(ValueError, match="timed"):
        measured_run([1.0], [warm, warm], result)
    assert compare({"thundersync": stats["thundersync"]}).speedup == {}
    assert s.learner_cpu_s is None and learner_thread_lines(stats) == []  # runs that did not record it


def test_learner_thread_cpu_drops_warm_up_and_is_reported_against_sync():
    """run_one records (CPU s, preemptions) of the training_step thread per step; the summary averages the
    measured steps and the report sets each schedule's CPU beside sync's and beside its own L."""
    warm = _step(0, "sync", 0.0, 9.0, [("source_backward", 1.0, 9.0, 20.0)])
    steps = {name: [_step(k, name, 10.0 * k, 10.0 * k + 4.0,
                          [("source_backward", 10.0 * k + 2.0, 10.0 * k + 4.0, 10.0 * k + 4.0 + busy)])
                    for k in (1, 2)] for name, busy in (("sync", 2.0), ("thundersync", 3.0))}
    usage = {"sync": [[9.0, 99], [2.0, 10], [2.0, 30]], "thundersync": [[9.0, 99], [2.5, 100], [2.5, 300]]}
    runs = {}
    for name in steps:
        result = {"peak_rss_mb": {"self": 1.0, "total": 1.0}, "cpu_cores_used": 1.0, "foreign_cpu_cores": 0.0,
                  "learner_thread_cpu": usage[name]}
        runs[name] = measured_run([99.0, 8.0, 8.0], [warm, *steps[name]], result)
    assert runs["thundersync"].learner_cpu_s == (2.5, 2.5) and runs["thundersync"].learner_preemptions == (100, 300)
    stats = {name: summarize([run]) for name, run in runs.items()}
    assert (stats["thundersync"].learner_cpu_s, stats["thundersync"].learner_preemptions) == (2.5, 200.0)
    lines = learner_thread_lines(stats)
    assert lines[0] == "learner thread sync: CPU 2.00 s/step, L 2.00 s, 20 preemptions/step"
    assert lines[1] == ("learner thread thundersync: CPU 2.50 s/step, +25% vs sync (L +50%), L 3.00 s, "
                        "200 preemptions/step")
    bad = {"peak_rss_mb": {"self": 1.0, "total": 1.0}, "cpu_cores_used": 1.0, "foreign_cpu_cores": 0.0,
           "learner_thread_cpu": [[1.0, 1]]}
    with pytest.raises(ValueError, match="learner thread's CPU recorded for 1"):
        measured_run([99.0, 8.0, 8.0], [warm, *steps["sync"]], bad)


def test_gap_split_attributes_the_step_against_its_replay_to_rollout_tail_and_suffix():
    """Sync: R = 4, two backwards of 1 s ready at 1 and 3, P = 0.5; the content replay (the trace has no content
    times: content = reward) serves them 1→2, 3→4: tail 0, T = 4.5. ThunderSync: R = 4.3 (the rollout slowed by
    0.3), backwards of 1.5 s each running 1→2.5, 3→4.5 and on to 4.8 after a 0.3 s fold, P = 0.6: T = 5.4."""
    result = {"peak_rss_mb": {"self": 1.0, "total": 1.0}, "cpu_cores_used": 1.0, "foreign_cpu_cores": 0.0}
    warm = _step(0, "sync", 0.0, 9.0, [("source_backward", 1.0, 9.0, 20.0)])
    sync = [_step(k, "sync", 10.0 * k, 10.0 * k + 4.0,
                  [("source_backward", 10.0 * k + 1.0, 10.0 * k + 4.0, 10.0 * k + 5.0),
                   ("source_backward", 10.0 * k + 3.0, 10.0 * k + 5.0, 10.0 * k + 6.0)], publish_gap=0.5)
            for k in (1, 2)]
    ts = [_step(k, "thundersync:content", 10.0 * k, 10.0 * k + 4.3,
                [("content_backward", 10.0 * k + 1.0, 10.0 * k + 1.0, 10.0 * k + 2.5),
                 ("content_backward", 10.0 * k + 3.0, 10.0 * k + 3.0, 10.0 * k + 4.5),
                 ("group_fold", 10.0 * k + 4.5, 10.0 * k + 4.5, 10.0 * k + 4.8)], publish_gap=0.6)
          for k in (1, 2)]
    stats = {"sync": summarize([measured_run([99.0, 6.5, 6.5], [warm, *sync], result)]),
             "thundersync:content": summarize([measured_run([99.0, 5.4, 5.4], [warm, *ts], result)])}
    assert stats["sync"].replay_release_tail_s["content"] == pytest.approx(0.0)
    g = compare(stats).gap_splits["thundersync:content"]
    assert (g.measured_s, g.predicted_s) == (pytest.approx(5.4), pytest.approx(4.5))
    assert (g.rollout_s, g.tail_s, g.suffix_s) == (pytest.approx(0.3), pytest.approx(0.5), pytest.approx(0.1))
    assert g.measured_s - g.predicted_s == pytest.approx(g.rollout_s + g.tail_s + g.suffix_s)
    assert g.learner_s == pytest.approx(3.3 - 2.0)
    assert gap_lines(compare(stats)) == [
        "thundersync:content traced step 5.40 s vs replay 4.50 s (+0.90) = rollout +0.30 + learner tail +0.50 + "
        "barrier/publish +0.10; learner busy +1.30 s vs sync"]
    assert gap_lines(compare({"sync": stats["sync"]})) == []


def test_side_by_side_places_steps_one_after_another():
    a = _step(3, "sync", 100.0, 104.0, [("source_backward", 101.0, 104.0, 106.0)], publish_gap=1.0)
    b = _step(3, "thundersync", 500.0, 504.0, [("source_backward", 501.0, 501.0, 503.0)], publish_gap=1.0)
    laid = side_by_side([a, b], gap=0.5)
    assert laid[0].start == 0.0 and laid[0].publish_end == pytest.approx(7.0)
    assert laid[1].start == pytest.approx(7.5) and laid[1].events[0].ready == pytest.approx(8.5)
    assert [s.wall for s in laid] == pytest.approx([a.wall, b.wall])


def test_split_cores_gives_the_learner_one_cpu():
    plan = split_cores({0, 1, 2})
    assert plan.learner == {2} and plan.rollout == {0, 1}
    with pytest.raises(ValueError, match="at least 2"):
        split_cores({0})


def test_markdown_tables_render_every_schedule_and_the_prediction():
    from benchmarks.markdown import render

    def summary(wall, idle):
        return {"step_wall_s": wall, "step_wall_stdev_s": 0.1, "rollout_s": 4.0, "learner_busy_s": 4.0,
                "balance_ratio": 1.0, "learner_idle_fraction": idle, "learner_tail_s": 0.5, "peak_rss_mb": 600.0,
                "stats_peak_mb": 38.1, "foreign_cpu_cores": 0.2, "trajectory_duration_cv": 0.6}

    report = {"command": "python -m benchmarks --preset quick", "date": "2026-12-01", "seconds": 200.0,
              "points": [{"name": "quick", "schedules": {"sync": summary(8.0, 0.5), "thundersync": summary(4.4, 0.09),
                                                         "trl": summary(9.0, 0.55)},
                          "compare": {"speedup": {"sync": 1.0, "thundersync": 8.0 / 4.4, "trl": 8.0 / 9.0},
                                      "predicted_speedup": 1.9, "measured_speedup_step": 8.0 / 4.4,
                                      "prediction_gap": (8.0 / 4.4) / 1.9 - 1}}]}
    text = render(report)
    assert "| quick | thundersync | 4.40 ± 0.10 | 1.82× |" in text
    assert "| quick | trl | 9.00 ± 0.10 | 0.89× |" in text and "| 600 | – |" in text
    assert "| quick | 1.00 | 0.60 | 8.00 | 4.40 | 1.82× | 1.90× | -4.3% | 9% | +0%, +0% | – / – | 0.20 |" in text


def test_tool_calls_without_the_sandbox_print_what_the_sandboxed_command_prints():
    """`--sandbox off`: the same observation (so the same tokens), after the same sleep, without a sandbox."""
    from benchmarks.workload import env_factory

    w = Workload(latency_mean=0.01)
    command = command_for(w, 2, 5, 1)
    sandboxed = env_factory(w)()
    bare = env_factory(w.with_(sandbox=False))()
    assert sandboxed.sandbox is not None and bare.sandbox is None
    assert bare.run_shell(command) == sandboxed.run_shell(command) == (
        "exit code: 0\nstep 2 traj 5 turn 1\nREADME.md\ndata.txt\n")
    with pytest.raises(ValueError, match="not a benchmark command"):
        bare.run_shell("rm -rf /")
    assert parse_args(["--sandbox", "off"]).sandbox is False
