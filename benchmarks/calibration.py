"""Calibrate the tool-latency mean that gives a benchmark point its target balance ρ = L/R.

A probe run (`sync`, tool latency 0) measures the learner's seconds per trajectory and a trajectory's duration
without any sleep (sandbox start-up, agent loop, turns). The workload's seeded trajectory durations,
`overhead + mean × units_i`, are then list-scheduled on the rollout slots (the agent engine's thread pool starts
trajectories in index order as slots free up), and the mean is bisected until the predicted R equals L/ρ.
With a grading latency, each trajectory's seeded grading time is added after its slot ends (grading holds no
slot), so R — the last reward — includes it and the tool latency shrinks to keep ρ.
The realized R, L and ρ of every run are measured and reported; calibration only aims.
"""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from trl_thundersync.trace.records import StepTrace

from .workload import Workload, grading_seconds, trajectory_latency_units


def makespan(durations: Sequence[float], slots: int, grading: Sequence[float] | None = None) -> float:
    """Greedy FIFO list scheduling of `durations` on `slots` (the agent engine's thread pool): the batch's R.

    `grading[i]`: seconds trajectory i is graded after it ends, outside the slots (R is its last reward)."""
    free = [0.0] * max(1, min(slots, len(durations)))
    end = 0.0
    for i, d in enumerate(durations):
        start = heapq.heappop(free)
        end = max(end, start + d + (grading[i] if grading is not None else 0.0))
        heapq.heappush(free, start + d)
    return end


def predicted_rollout(w: Workload, latency_mean: float, overhead_per_trajectory: float,
                      steps: Sequence[int] | None = None) -> float:
    """Mean R over `steps` (default: the measured steps 1..steps−1) for a tool-latency mean."""
    steps = steps if steps is not None else range(1, max(2, w.steps))
    spans = [makespan([overhead_per_trajectory + latency_mean * u for u in trajectory_latency_units(w, s)],
                      w.concurrency, [grading_seconds(w, s, i) for i in range(w.batch)]) for s in steps]
    return sum(spans) / len(spans)


def calibrated_latency_mean(w: Workload, learner_per_trajectory: float, overhead_per_trajectory: float,
                            rollout_fixed: float = 0.0) -> float:
    """The tool-latency mean that makes R ≈ L/ρ with L = batch × learner seconds per trajectory (bisection).

    `rollout_fixed` is a per-batch cost outside the slots (admission, scoring the last trajectory). Returns 0 when
    the rollout is too slow for ρ even without sleeping; the run then reports the ρ it could reach.
    """
    if not w.balance or w.balance <= 0:
        raise ValueError(f"balance={w.balance!r}: calibration needs a positive target ρ")
    target = w.batch * learner_per_trajectory / w.balance - rollout_fixed
    if predicted_rollout(w, 0.0, overhead_per_trajectory) >= target:
        return 0.0
    lo, hi = 0.0, 1.0
    while predicted_rollout(w, hi, overhead_per_trajectory) < target:
        hi *= 2
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if predicted_rollout(w, mid, overhead_per_trajectory) < target else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class Calibration:
    """What a probe run without tool latency measured. Seconds."""

    learner_per_trajectory_s: float  # learner service per trajectory: median backward + its share of group folds
    overhead_per_trajectory_s: float  # mean trajectory duration without sleeps
    rollout_fixed_s: float  # measured R minus the slot schedule of those durations (≥ 0)
    rollout_without_latency_s: float  # mean measured R of the probe

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def calibration_from_probe(probe: Workload, steps: Sequence[StepTrace]) -> Calibration:
    """Read a `Calibration` off the measured steps (warm-up dropped) of a probe run with latency 0."""
    if not steps:
        raise ValueError("calibration needs at least one measured probe step")
    # Per-item medians: other processes on a shared machine slow some items a lot; the median is what most
    # items cost. A step's learner time is B backwards plus its group folds.
    backwards = [e.end - e.start for s in steps for e in s.events if e.kind == "source_backward"]
    folds = [e.end - e.start for s in steps for e in s.events if e.kind == "group_fold"]
    if not backwards:
        raise ValueError("the probe steps recorded no learner backwards")
    learner = probe.batch * statistics.median(backwards) + (statistics.median(folds) * len(folds) / len(steps)
                                                            if folds else 0.0)
    durations = [e.end - e.start for s in steps for e in s.events if e.kind == "trajectory"]
    if not durations:
        raise ValueError("the probe steps recorded no trajectories")
    overhead = statistics.fmean(durations)
    rollout = statistics.fmean(s.rollout_end - s.start for s in steps)
    fixed = max(0.0, rollout - predicted_rollout(probe, 0.0, overhead, [s.step for s in steps]))
    return Calibration(learner_per_trajectory_s=learner / probe.batch, overhead_per_trajectory_s=overhead,
                       rollout_fixed_s=fixed, rollout_without_latency_s=rollout)
