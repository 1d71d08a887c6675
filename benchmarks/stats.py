"""Statistics of benchmark runs: per-schedule summaries, speedups and the trace-replay prediction.

Pure functions over `StepTrace`s and per-step wall times, so they are unit-tested on hand-made traces
(`tests/unit/benchmarks/test_bench_logic.py`). A *run* is one schedule in one process; its first step is dropped as
warm-up (model load, first allocation, engine start) before anything is averaged.

The prediction: ThunderSync's time on a step is predicted from the **sync** trace of the same step (paper Eq. 14):
the sync run records when every source became ready (reward known) and how long its backward took; replaying those
items through one learner lane that may start each at its ready time gives what streaming should take. The measured
ThunderSync speedup is then compared with `sync replay R + L + P` ÷ `predicted T`. With several release points
(`thundersync:reward`, `thundersync:content`, ...), each one's prediction replays the sync trace (and the reward-
release trace) with that release point's ready times (`trace.model.predict_release`).

Overlap cost per side (issue 10 item 4), measured, not modelled:
- learner: the median whole-trajectory backward that ran before R vs after R within the run, and each backward that
  ran before R against the same trajectory's backward in the sync runs (where the rollout side was idle);
- rollout: the median turn (generation request → action complete) and tool call that ran while the learner was busy
  (≥ half of its interval covered by learner items) vs while it was idle (no overlap at all), within the run, and
  each busy one against the same (step, trajectory, turn) in the sync runs, whose rollout phase has the learner idle.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from trl_thundersync.trace.model import RELEASE_MODES, Replay, predict_release, predicted_vs_measured, replay
from trl_thundersync.trace.records import StepTrace, TraceEvent

from .gap_split import GapSplit, gap_split
from .workload import split_schedule

WHOLE_BACKWARD_KINDS = ("source_backward", "content_backward")  # one trajectory's full forward + backward
BUSY_FRACTION = 0.5  # a rollout interval "ran while the learner was busy" when learner items cover ≥ this share


@dataclass(frozen=True)
class RunSteps:
    """The measured steps of one run (warm-up already dropped)."""

    walls: tuple[float, ...]  # step wall time from the trainer callbacks (on_step_begin → on_step_end), s
    traces: tuple[StepTrace, ...]  # the matching step traces
    peak_rss_mb: float  # the run process's peak resident set, MiB
    peak_rss_with_children_mb: float  # + its largest finished child process (sandboxes), MiB
    cpu_cores_used: float  # CPU seconds of the run (process + children) ÷ run wall seconds
    foreign_cpu_cores: float  # CPU other processes on the machine used meanwhile, in cores
    # per measured step, the thread that runs `training_step` (the learner's; stock TRL generates there too): its CPU
    # seconds and involuntary context switches (the scheduler took its core while it could run); empty when the run
    # did not record them
    learner_cpu_s: tuple[float, ...] = ()
    learner_preemptions: tuple[int, ...] = ()


def measured_run(walls: Sequence[float], traces: Sequence[StepTrace], result: dict[str, Any]) -> RunSteps:
    """Pair a run's step walls with its traces and drop the first (warm-up) step; `result` is run_one's JSON."""
    if len(walls) != len(traces):
        raise ValueError(f"{len(walls)} steps timed but {len(traces)} traced")
    if len(walls) < 2:
        raise ValueError(f"a run needs ≥ 2 steps (the first is warm-up); got {len(walls)}")
    usage = result.get("learner_thread_cpu") or []
    if usage and len(usage) != len(walls):
        raise ValueError(f"{len(walls)} steps timed but the learner thread's CPU recorded for {len(usage)}")
    return RunSteps(walls=tuple(walls[1:]), traces=tuple(traces[1:]), peak_rss_mb=result["peak_rss_mb"]["self"],
                    peak_rss_with_children_mb=result["peak_rss_mb"]["total"],
                    cpu_cores_used=result["cpu_cores_used"], foreign_cpu_cores=result["foreign_cpu_cores"],
                    learner_cpu_s=tuple(float(cpu) for cpu, _ in usage[1:]),
                    learner_preemptions=tuple(int(n) for _, n in usage[1:]))


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
              if e.kind in WHOLE_BACKWARD_KINDS and e.end <= s.rollout_end]
    after = [e.end - e.start for s in steps for e in s.events
             if e.kind in WHOLE_BACKWARD_KINDS and e.start >= s.rollout_end]
    return _median(during), _median(after)


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _merged(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _covered(a: float, b: float, merged: Sequence[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in merged)


def _learner_cover(step: StepTrace) -> list[tuple[float, float]]:
    return _merged([(e.start, e.end) for e in step.events if e.lane == "learner"])


def _rollout_items(step: StepTrace, lane: str, kind: str) -> list[tuple[tuple[int, int, int], TraceEvent]]:
    """(key, event) of the step's rollout turns or tool calls; key = (step, trajectory, turn or ordinal)."""
    events = sorted((e for e in step.events if e.lane == lane and e.kind == kind), key=lambda e: (e.index, e.start))
    out, ordinal, last = [], 0, None
    for e in events:
        ordinal = ordinal + 1 if e.index == last else 0
        last = e.index
        out.append(((step.step, e.index, e.turn if e.turn >= 0 else ordinal), e))
    return out


def overlap_split(steps: Sequence[StepTrace], lane: str, kind: str) -> tuple[list[float], list[float]]:
    """Durations of the steps' `lane`/`kind` intervals (rollout turns, tool calls) that ran while the learner was
    busy (≥ `BUSY_FRACTION` covered by learner items) and while it was idle (not covered at all)."""
    busy, idle = [], []
    for step in steps:
        cover = _learner_cover(step)
        for _, e in _rollout_items(step, lane, kind):
            d = e.end - e.start
            if d <= 0:
                continue
            share = _covered(e.start, e.end, cover) / d
            if share >= BUSY_FRACTION:
                busy.append(d)
            elif share == 0.0:
                idle.append(d)
    return busy, idle


def _keyed_durations(steps: Sequence[StepTrace], lane: str, kind: str) -> dict[tuple[int, int, int], float]:
    by_key: dict[tuple[int, int, int], list[float]] = {}
    for step in steps:
        for key, e in _rollout_items(step, lane, kind):
            by_key.setdefault(key, []).append(e.end - e.start)
    return {k: statistics.median(v) for k, v in by_key.items()}


@dataclass(frozen=True)
class PairedSlowdown:
    """The same work measured under overlap and in the sync runs: medians over the matched pairs."""

    relative: float | None  # median (overlapped / sync − 1)
    seconds: float | None  # median (overlapped − sync), s
    pairs: int


def _paired(values: Sequence[tuple[float, float]]) -> PairedSlowdown:
    pairs = [(x, ref) for x, ref in values if ref > 0]
    return PairedSlowdown(_median([x / ref - 1.0 for x, ref in pairs]), _median([x - ref for x, ref in pairs]),
                          len(pairs))


def rollout_slowdown_vs(reference: Sequence[StepTrace], steps: Sequence[StepTrace], lane: str,
                        kind: str) -> PairedSlowdown:
    """Each `lane`/`kind` interval of `steps` that ran while the learner was busy, against the same (step,
    trajectory, turn) in `reference` (the sync runs: median over their repeats)."""
    ref = _keyed_durations(reference, lane, kind)
    values = []
    for step in steps:
        cover = _learner_cover(step)
        for key, e in _rollout_items(step, lane, kind):
            d = e.end - e.start
            if d > 0 and key in ref and _covered(e.start, e.end, cover) / d >= BUSY_FRACTION:
                values.append((d, ref[key]))
    return _paired(values)


def backward_slowdown_vs(reference: Sequence[StepTrace], steps: Sequence[StepTrace]) -> PairedSlowdown:
    """Each whole-trajectory backward of `steps` that ran before R against the same trajectory's in `reference`."""
    by_key: dict[tuple[int, int], list[float]] = {}
    for s in reference:
        for e in s.events:
            if e.kind in WHOLE_BACKWARD_KINDS:
                by_key.setdefault((s.step, e.index), []).append(e.end - e.start)
    ref = {k: statistics.median(v) for k, v in by_key.items()}
    values = [(e.end - e.start, ref[(s.step, e.index)]) for s in steps for e in s.events
              if e.kind in WHOLE_BACKWARD_KINDS and e.end <= s.rollout_end and (s.step, e.index) in ref]
    return _paired(values)


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
    replay_release_s: dict[str, float] | None = None  # release mode → mean predicted T (`predict_release`)
    replay_release_tail_s: dict[str, float] | None = None  # release mode → mean predicted learner tail [c_n − R]⁺
    turn_busy_s: float | None = None  # median rollout turn while the learner was busy (`overlap_split`)
    turn_idle_s: float | None = None  # median rollout turn while the learner was idle
    turn_busy_n: int = 0
    turn_idle_n: int = 0
    tool_busy_s: float | None = None  # median tool call while the learner was busy
    tool_idle_s: float | None = None  # median tool call while the learner was idle
    tool_busy_n: int = 0
    tool_idle_n: int = 0
    learner_cpu_s: float | None = None  # mean CPU seconds per step of the thread running training_step (None: not
    # recorded); next to L it separates a learner that computed longer from one that waited for its core
    learner_preemptions: float | None = None  # mean involuntary context switches of that thread per step

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mean(xs: Sequence[float]) -> float:
    return statistics.fmean(xs) if xs else math.nan


def _mean_or_none(xs: Sequence[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


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
    turn_busy, turn_idle = overlap_split(traces, "rollout", "turn")
    tool_busy, tool_idle = overlap_split(traces, "tool", "tool_call")
    predicted = {mode: [predict_release(t, mode) for t in traces] for mode in RELEASE_MODES}
    release = {mode: _mean([r.thundersync_time for r in rs]) for mode, rs in predicted.items()}
    return ScheduleSummary(
        steps=len(traces), step_wall_s=_mean(walls), step_wall_stdev_s=statistics.stdev(walls) if len(walls) > 1
        else 0.0, step_walls_s=tuple(walls), trace_wall_s=_mean([t.wall for t in traces]),
        rollout_s=_mean([r.rollout_end for r in reps]), learner_busy_s=_mean([r.learner_service for r in reps]),
        suffix_s=_mean([r.suffix for r in reps]), balance_ratio=_mean([r.balance_ratio for r in reps]),
        learner_tail_s=_mean([max(0.0, t.learner_end - t.rollout_end) for t in traces]),
        learner_idle_fraction=_mean([max(0.0, 1 - r.learner_service / t.wall)
                                     for r, t in zip(reps, traces, strict=True)]),
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
        backward_during_rollout_s=during, backward_after_rollout_s=after, replay_release_s=release,
        replay_release_tail_s={mode: _mean([r.learner_tail for r in rs]) for mode, rs in predicted.items()},
        turn_busy_s=_median(turn_busy), turn_idle_s=_median(turn_idle), turn_busy_n=len(turn_busy),
        turn_idle_n=len(turn_idle), tool_busy_s=_median(tool_busy), tool_idle_s=_median(tool_idle),
        tool_busy_n=len(tool_busy), tool_idle_n=len(tool_idle),
        learner_cpu_s=_mean_or_none([c for r in runs for c in r.learner_cpu_s]),
        learner_preemptions=_mean_or_none([n for r in runs for n in r.learner_preemptions]),
    )


@dataclass(frozen=True)
class Comparison:
    """Speedups over `sync` at one point, and each ThunderSync schedule's measured speedup next to the replay
    predictions. The scalar fields are about the primary ThunderSync schedule (plain "thundersync", else the
    reward-release one, else the first)."""

    speedup: dict[str, float]  # schedule → sync mean step wall ÷ its mean step wall
    predicted_speedup: float | None  # sync's (R + L + P) ÷ Eq. 14 prediction, both from the sync traces
    measured_speedup_step: float | None  # = speedup[primary] (callback step walls)
    measured_speedup_trace: float | None  # the same on traced walls (admission → publication)
    prediction_gap: float | None  # measured_speedup_step ÷ predicted − 1 (< 0: slower than the model)
    primary: str | None = None  # the ThunderSync schedule the scalar fields describe
    predicted_from_sync: dict[str, float] | None = None  # thundersync schedule → its release mode replayed on sync
    predicted_from_reward: dict[str, float] | None = None  # ... replayed on the reward-release schedule's traces
    prediction_gaps: dict[str, float] | None = None  # measured ÷ predicted_from_sync − 1
    overlap_vs_sync: dict[str, dict[str, Any]] | None = None  # schedule → paired slowdowns vs the sync runs
    gap_splits: dict[str, GapSplit] | None = None  # thundersync schedule → its step vs its replay, by phase

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def thundersync_schedules(names: Sequence[str]) -> list[str]:
    """The ThunderSync schedules among `names` (plain "thundersync" and "thundersync:<release>"), in order."""
    return [n for n in names if n.partition(":")[0] == "thundersync"]


def primary_schedule(names: Sequence[str]) -> str | None:
    ts = thundersync_schedules(names)
    for preferred in ("thundersync", "thundersync:reward"):
        if preferred in ts:
            return preferred
    return ts[0] if ts else None


def _speedup_of(summary: ScheduleSummary, mode: str) -> float | None:
    if not summary.replay_release_s or mode not in summary.replay_release_s:
        return None
    return summary.replay_sync_s / summary.replay_release_s[mode]


def compare(stats: dict[str, ScheduleSummary], traces: dict[str, Sequence[StepTrace]] | None = None) -> Comparison:
    """Speedups vs `sync` (none without a sync summary); predictions need sync and a ThunderSync schedule.
    With `traces` (schedule → its measured steps) also the paired overlap slowdowns of every schedule vs sync."""
    sync = stats.get("sync")
    if sync is None:
        return Comparison({}, None, None, None, None)
    speedup = {name: sync.step_wall_s / s.step_wall_s for name, s in stats.items()}
    primary = primary_schedule(list(stats))
    if primary is None:
        return Comparison(speedup, None, None, None, None)
    ts = stats[primary]
    predicted = sync.replay_sync_s / sync.replay_thundersync_s
    measured = speedup[primary]
    reward_name = next((n for n in ("thundersync:reward", "thundersync") if n in stats), None)
    from_sync, from_reward, gaps, splits = {}, {}, {}, {}
    for name in thundersync_schedules(list(stats)):
        mode = split_schedule(name)[1]
        p = _speedup_of(sync, mode)
        if p is not None:
            from_sync[name] = p
            gaps[name] = speedup[name] / p - 1.0
        split = gap_split(stats[name], sync, mode)
        if split is not None:
            splits[name] = split
        if reward_name is not None:
            q = _speedup_of(stats[reward_name], mode)
            if q is not None:
                from_reward[name] = q
    overlap = None
    if traces is not None and "sync" in traces:
        overlap = {}
        for name, steps in traces.items():
            if name == "sync":
                continue
            overlap[name] = {
                "backward_during_vs_sync": asdict(backward_slowdown_vs(traces["sync"], steps)),
                "turn_busy_vs_sync": asdict(rollout_slowdown_vs(traces["sync"], steps, "rollout", "turn")),
                "tool_busy_vs_sync": asdict(rollout_slowdown_vs(traces["sync"], steps, "tool", "tool_call")),
            }
    return Comparison(speedup, predicted, measured, sync.trace_wall_s / ts.trace_wall_s, measured / predicted - 1.0,
                      primary=primary, predicted_from_sync=from_sync, predicted_from_reward=from_reward,
                      prediction_gaps=gaps, overlap_vs_sync=overlap, gap_splits=splits)


def shift(step: StepTrace, delta: float) -> StepTrace:
    """The same step with every time moved by `delta` seconds (to lay steps of different runs side by side)."""
    def moved(x: float | None) -> float | None:
        return None if x is None else x + delta

    events = tuple(replace(e, start=e.start + delta, end=e.end + delta, ready=moved(e.ready),
                           content_ready=moved(e.content_ready), reward_at=moved(e.reward_at)) for e in step.events)
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
