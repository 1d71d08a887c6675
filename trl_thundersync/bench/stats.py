"""Statistics of benchmark runs: per-schedule summaries, speedups and the trace-replay prediction.

Pure functions over `StepTrace`s and per-step wall times, so they are unit-tested on hand-made traces
(`tests/unit/test_bench_logic.py`). A *run* is one schedule in one process; its first step is dropped as warm-up
(model load, first allocation, engine start) before anything is averaged.

The prediction: ThunderSync's time on a step is predicted from the **sync** trace of the same step (paper Eq. 14):
the sync run records when every source became ready (reward known) and how long its backward took; replaying those
items through one learner lane that may start each at its ready time gives what streaming should take. The measured
ThunderSync speedup is then compared with `sync replay R + L + P` ÷ `predicted T`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..trace.model import Replay, predicted_vs_measured, replay
from ..trace.records import StepTrace


@dataclass(frozen=True)
class RunSteps:
    """The measured steps of one run (warm-up already dropped)."""

    walls: tuple[float, ...]  # step wall time from the trainer callbacks (on_step_begin → on_step_end), s
    traces: tuple[StepTrace, ...]  # the matching step traces
    peak_rss_mb: float  # the run process's peak resident set, MiB
    peak_rss_with_children_mb: float  # + its largest finished child process (sandboxes), MiB
    cpu_cores_used: float  # CPU seconds of the run (process + children) ÷ run wall seconds
    foreign_cpu_cores: float  # CPU other processes on the machine used meanwhile, in cores


def measured_run(walls: Sequence[float], traces: Sequence[StepTrace], result: dict[str, Any]) -> RunSteps:
    """Pair a run's step walls with its traces and drop the first (warm-up) step; `result` is run_one's JSON."""
    if len(walls) != len(traces):
        raise ValueError(f"{len(walls)} steps timed but {len(traces)} traced")
    if len(walls) < 2:
        raise ValueError(f"a run needs ≥ 2 steps (the first is warm-up); got {len(walls)}")
    return RunSteps(walls=tuple(walls[1:]), traces=tuple(traces[1:]), peak_rss_mb=result["peak_rss_mb"]["self"],
                    peak_rss_with_children_mb=result["peak_rss_mb"]["total"],
                    cpu_cores_used=result["cpu_cores_used"], foreign_cpu_cores=result["foreign_cpu_cores"])


def predict_thundersync(step: StepTrace) -> Replay:
    """What ThunderSync's single lane would take on this step's recorded work (paper Eq. 14), from any schedule.

    Items keep their recorded service order and are released at their recorded `ready` (a trajectory's backward:
    when its reward was known; stock TRL's whole-batch item: at R). A group fold depends only on its group's
    backwards, which precede it in that order, so it is released at the step start: in a `sync` trace its `ready`
    is when sync reached it (after R), which would wrongly delay it. R and the serial suffix P are the step's own.
    """
    learner = sorted((e for e in step.events if e.lane == "learner"), key=lambda e: (e.start, e.end))
    items = [(step.start if e.kind == "group_fold" or e.ready is None else e.ready, e.end - e.start)
             for e in learner]
    suffix = max(0.0, step.publish_end - max(step.rollout_end, step.learner_end))
    return replay(items, step.rollout_end, suffix, step.start)


def backward_medians(steps: Sequence[StepTrace]) -> tuple[float | None, float | None]:
    """Median service of trajectory backwards that ran entirely before R, and entirely after R (None if none).

    Within one ThunderSync step the same kind of work, measured twice: the ratio is what overlapping with the
    rollout side (its threads share the process and the GIL; its sandboxes share the cores) costs the learner.
    """
    during = [e.end - e.start for s in steps for e in s.events
              if e.kind == "source_backward" and e.end <= s.rollout_end]
    after = [e.end - e.start for s in steps for e in s.events
             if e.kind == "source_backward" and e.start >= s.rollout_end]
    return (statistics.median(during) if during else None, statistics.median(after) if after else None)


def trajectory_duration_cv(step: StepTrace) -> float:
    """Population CV of the step's trajectory durations (rollout lane, kind "trajectory"); 0 with < 2."""
    durations = [e.end - e.start for e in step.events if e.kind == "trajectory"]
    if len(durations) < 2 or statistics.fmean(durations) <= 0:
        return 0.0
    return statistics.pstdev(durations) / statistics.fmean(durations)


@dataclass(frozen=True)
class ScheduleSummary:
    """One schedule at one benchmark point: means over the measured steps of all its runs. Times in seconds."""

    steps: int  # measured steps (all runs)
    step_wall_s: float  # mean step wall time (callbacks)
    step_wall_stdev_s: float  # its sample standard deviation over steps
    step_walls_s: tuple[float, ...]  # every measured step wall
    trace_wall_s: float  # mean traced wall (batch admitted → publication acknowledged)
    rollout_s: float  # R
    learner_busy_s: float  # L = Σ service of learner items
    suffix_s: float  # P = barrier + optimizer + publication after max(R, c_n)
    balance_ratio: float  # realized ρ = L/R
    learner_tail_s: float  # [c_n − R]⁺
    learner_idle_fraction: float  # 1 − L / traced wall
    learner_tflops_per_s: float  # learner FLOPs (Appendix B) ÷ traced wall
    mfu: float | None  # learner TFLOP/s ÷ peak (None without --peak-flops)
    stats_peak_mb: float  # peak gradient-statistics memory (G1, G2, batch buffers); 0 for stock TRL
    trajectory_duration_cv: float  # realized spread of trajectory durations
    peak_rss_mb: float  # max over runs
    peak_rss_with_children_mb: float  # max over runs
    cpu_cores_used: float  # mean over runs
    foreign_cpu_cores: float  # mean over runs: machine noise
    replay_thundersync_s: float  # Eq. 14 prediction of ThunderSync on these steps' recorded work
    replay_sync_s: float  # R + L + P on these steps
    replay_abs_error: float | None  # ThunderSync/sync only: mean |measured − replay of own schedule| / replay
    backward_during_rollout_s: float | None  # median backward that ran before R (None: no such item)
    backward_after_rollout_s: float | None  # median backward that ran after R

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mean(xs: Sequence[float]) -> float:
    return statistics.fmean(xs) if xs else math.nan


def summarize(runs: Sequence[RunSteps], peak_flops: float | None = None) -> ScheduleSummary:
    """Aggregate the measured steps of one schedule's runs."""
    walls = [w for r in runs for w in r.walls]
    traces = [t for r in runs for t in r.traces]
    if not traces:
        raise ValueError("summarize needs at least one measured step")
    reps = [predict_thundersync(t) for t in traces]
    tflops = [sum(e.flops for e in t.events) / t.wall / 1e12 for t in traces]
    own_schedule = traces[0].schedule in ("sync", "thundersync")
    during, after = backward_medians(traces)
    return ScheduleSummary(
        steps=len(traces), step_wall_s=_mean(walls), step_wall_stdev_s=statistics.stdev(walls) if len(walls) > 1
        else 0.0, step_walls_s=tuple(walls), trace_wall_s=_mean([t.wall for t in traces]),
        rollout_s=_mean([r.rollout_end for r in reps]), learner_busy_s=_mean([r.learner_service for r in reps]),
        suffix_s=_mean([r.suffix for r in reps]), balance_ratio=_mean([r.balance_ratio for r in reps]),
        learner_tail_s=_mean([max(0.0, t.learner_end - t.rollout_end) for t in traces]),
        learner_idle_fraction=_mean([max(0.0, 1 - r.learner_service / t.wall) for r, t in zip(reps, traces)]),
        learner_tflops_per_s=_mean(tflops), mfu=_mean([x * 1e12 / peak_flops for x in tflops]) if peak_flops
        else None, stats_peak_mb=max(t.stats_bytes for t in traces) / 2**20,
        trajectory_duration_cv=_mean([trajectory_duration_cv(t) for t in traces]),
        peak_rss_mb=max(r.peak_rss_mb for r in runs),
        peak_rss_with_children_mb=max(r.peak_rss_with_children_mb for r in runs),
        cpu_cores_used=_mean([r.cpu_cores_used for r in runs]),
        foreign_cpu_cores=_mean([r.foreign_cpu_cores for r in runs]),
        replay_thundersync_s=_mean([r.thundersync_time for r in reps]),
        replay_sync_s=_mean([r.sync_time for r in reps]),
        replay_abs_error=predicted_vs_measured(traces).mean_abs_relative_error if own_schedule else None,
        backward_during_rollout_s=during, backward_after_rollout_s=after,
    )


@dataclass(frozen=True)
class Comparison:
    """Speedups over `sync` at one point, and ThunderSync's measured speedup next to the replay prediction."""

    speedup: dict[str, float]  # schedule → sync mean step wall ÷ its mean step wall
    predicted_speedup: float | None  # sync's (R + L + P) ÷ Eq. 14 prediction, both from the sync traces
    measured_speedup_step: float | None  # = speedup["thundersync"] (callback step walls)
    measured_speedup_trace: float | None  # the same on traced walls (admission → publication)
    prediction_gap: float | None  # measured_speedup_step ÷ predicted − 1 (< 0: slower than the model)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(stats: dict[str, ScheduleSummary]) -> Comparison:
    """Speedups vs `sync` (none without a sync summary); the prediction needs sync and thundersync."""
    sync = stats.get("sync")
    if sync is None:
        return Comparison({}, None, None, None, None)
    speedup = {name: sync.step_wall_s / s.step_wall_s for name, s in stats.items()}
    ts = stats.get("thundersync")
    if ts is None:
        return Comparison(speedup, None, None, None, None)
    predicted = sync.replay_sync_s / sync.replay_thundersync_s
    measured = speedup["thundersync"]
    return Comparison(speedup, predicted, measured, sync.trace_wall_s / ts.trace_wall_s, measured / predicted - 1.0)


def shift(step: StepTrace, delta: float) -> StepTrace:
    """The same step with every time moved by `delta` seconds (to lay steps of different runs side by side)."""
    events = tuple(replace(e, start=e.start + delta, end=e.end + delta,
                           ready=None if e.ready is None else e.ready + delta) for e in step.events)
    return replace(step, start=step.start + delta, rollout_end=step.rollout_end + delta,
                   learner_end=step.learner_end + delta, barrier_end=step.barrier_end + delta,
                   publish_end=step.publish_end + delta, events=events)


def side_by_side(steps: Sequence[StepTrace], gap: float = 0.5) -> list[StepTrace]:
    """Place steps one after another on one time axis, `gap` seconds apart, the first starting at 0."""
    out: list[StepTrace] = []
    cursor = 0.0
    for step in steps:
        out.append(shift(step, cursor - step.start))
        cursor = out[-1].publish_end + gap
    return out
