"""Trace replay (paper Appendix F, Eq. 1–2 = Eq. 14, closed form Eq. 15): one learner lane, one step.

Push the learner items' (τ_j, p_j) through one learner lane and predict the step time T = max(R, c_n) + P; Sync
would take R + L + P (Eq. 16). `replay_step` replays a recorded step, `predicted_vs_measured` compares each step's
prediction for its own schedule with its measured wall time. Pure functions on floats.

Notation (paper): R rollout time, L = Σ p_j learner service, P serial suffix (reduction, optimizer, publication),
ρ = L/R balance ratio, κ = P/R suffix ratio, λ_K = [c_n − R]⁺/R normalized learner tail.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .records import StepTrace


@dataclass(frozen=True)
class Replay:
    """One step replayed through a single learner lane. Times in seconds, relative to the step start."""

    completions: tuple[float, ...]  # c_1..c_n in service order (Eq. 1)
    learner_end: float  # c_n (0 with no items)
    rollout_end: float  # R
    learner_service: float  # L = Σ p_j
    suffix: float  # P
    thundersync_time: float  # T = max(R, c_n) + P (Eq. 2)
    sync_time: float  # R + L + P: every item released at R (Eq. 16)
    learner_idle: float  # c_n − L: time in [0, c_n] the lane waits for ready work
    learner_tail: float  # [c_n − R]⁺: learner time left after the rollout closes
    speedup: float  # predicted sync_time / thundersync_time (Eq. 16)

    @property
    def balance_ratio(self) -> float:
        """ρ = L/R."""
        return self.learner_service / self.rollout_end

    @property
    def tail_ratio(self) -> float:
        """λ_K = [c_n − R]⁺/R."""
        return self.learner_tail / self.rollout_end

    @property
    def suffix_ratio(self) -> float:
        """κ = P/R."""
        return self.suffix / self.rollout_end


def relative_items(items: Iterable[tuple[float, float]], start: float) -> list[tuple[float, float]]:
    """(absolute τ_j, p_j) → (τ_j − start, p_j), rejecting non-finite values, negative service, τ before start."""
    out = []
    for j, (tau, p) in enumerate(items):
        if not (math.isfinite(tau) and math.isfinite(p)):
            raise ValueError(f"learner item {j}: ready={tau!r}, service={p!r} must be finite")
        if p < 0:
            raise ValueError(f"learner item {j}: service time {p!r} < 0")
        if tau < start:
            raise ValueError(f"learner item {j}: ready time {tau!r} precedes the step start {start!r}")
        out.append((tau - start, p))
    return out


def replay(items: Sequence[tuple[float, float]], rollout_end: float, suffix: float, start: float = 0.0) -> Replay:
    """Replay learner items through one lane (Eq. 1, Eq. 14) and predict the step endpoint (Eq. 2).

    `items` are (τ_j, p_j) in service order: τ_j the absolute ready time (same clock as `start` and `rollout_end`),
    p_j the service time. `suffix` is the duration P. With c_0 = 0: c_j = max(τ_j, c_{j−1}) + p_j, then
    T = max(R, c_n) + P, all relative to `start`. The order is the caller's; Eq. 14 takes readiness order, which
    minimizes c_n (Appendix F.1), so pass `sorted(items)` for that what-if. Items ready after R (deferred work)
    are allowed; the recurrence covers them, though the release laws of Eq. 19 assume τ_j ≤ R.
    """
    if not (math.isfinite(rollout_end) and rollout_end >= start):
        raise ValueError(f"rollout_end={rollout_end!r} must be finite and not before start={start!r}")
    if not (math.isfinite(suffix) and suffix >= 0):
        raise ValueError(f"suffix={suffix!r} must be a finite duration ≥ 0")
    r = rollout_end - start
    checked = relative_items(items, start)
    c, completions = 0.0, []
    for tau, p in checked:
        c = max(tau, c) + p
        completions.append(c)
    service = math.fsum(p for _, p in checked)
    t = max(r, c) + suffix
    if t <= 0:
        raise ValueError("the step takes no time (R = 0, P = 0, no learner work): nothing to predict")
    sync = r + service + suffix
    return Replay(completions=tuple(completions), learner_end=c, rollout_end=r, learner_service=service,
                  suffix=suffix, thundersync_time=t, sync_time=sync, learner_idle=max(0.0, c - service),
                  learner_tail=max(0.0, c - r), speedup=sync / t)


def completion_closed_form(items: Sequence[tuple[float, float]], start: float = 0.0) -> float:
    """c_n = max_j (τ_j + Σ_{i≥j} p_i) (Eq. 15), relative to `start`; equals `replay(...).learner_end` for any order."""
    checked = relative_items(items, start)
    best, after = 0.0, 0.0  # 0.0: c_n of an empty lane (c_0)
    for tau, p in reversed(checked):
        after += p
        best = max(best, tau + after)
    return best


def replay_step(step: StepTrace) -> Replay:
    """Replay a recorded step's learner lane: what ThunderSync's single lane would take with these release times.

    Items: events with lane == "learner", ordered by service start; τ_j = `ready`, p_j = end − start.
    R = rollout_end − start; P = publish_end − max(rollout_end, learner_end), the measured serial suffix after the
    learner (barrier, optimizer, publication and acknowledgement).
    """
    learner = sorted((e for e in step.events if e.lane == "learner"), key=lambda e: (e.start, e.end))
    for e in learner:
        if e.ready is None:
            raise ValueError(f"step {step.step}: learner event {e.kind} (index {e.index}, group {e.group}) has no "
                             "ready time; the replay needs τ_j for every learner item")
    suffix = step.publish_end - max(step.rollout_end, step.learner_end)
    if suffix < 0:
        raise ValueError(f"step {step.step}: publish_end {step.publish_end!r} precedes the learner/rollout end")
    return replay([(e.ready, e.end - e.start) for e in learner], step.rollout_end, suffix, step.start)


@dataclass(frozen=True)
class StepPrediction:
    """Measured wall time of one recorded step next to the replayed predictions."""

    step: int  # optimizer step index
    schedule: str  # the schedule the step ran under
    measured_wall: float  # publish_end − start
    predicted_thundersync: float  # T from the replay (Eq. 2)
    predicted_sync: float  # R + L + P
    predicted_wall: float  # the prediction for the step's own schedule ("thundersync" → T, otherwise R + L + P)
    relative_error: float  # (measured_wall − predicted_wall) / predicted_wall; > 0: runtime slower than the model


@dataclass(frozen=True)
class PredictionReport:
    """Per-step predictions and their means over the steps."""

    steps: tuple[StepPrediction, ...]
    mean_measured_wall: float
    mean_predicted_thundersync: float
    mean_predicted_sync: float
    mean_relative_error: float  # signed
    mean_abs_relative_error: float


def predicted_vs_measured(steps: Sequence[StepTrace]) -> PredictionReport:
    """Replay every step (Eq. 14) and compare the prediction for its schedule with its measured wall time."""
    if not steps:
        raise ValueError("predicted_vs_measured needs at least one step")
    rows = []
    for s in steps:
        rep = replay_step(s)
        predicted = rep.thundersync_time if s.schedule == "thundersync" else rep.sync_time
        rows.append(StepPrediction(step=s.step, schedule=s.schedule, measured_wall=s.wall,
                                   predicted_thundersync=rep.thundersync_time, predicted_sync=rep.sync_time,
                                   predicted_wall=predicted, relative_error=(s.wall - predicted) / predicted))

    def mean(values: Iterable[float]) -> float:
        return math.fsum(values) / len(rows)

    return PredictionReport(steps=tuple(rows), mean_measured_wall=mean(r.measured_wall for r in rows),
                            mean_predicted_thundersync=mean(r.predicted_thundersync for r in rows),
                            mean_predicted_sync=mean(r.predicted_sync for r in rows),
                            mean_relative_error=mean(r.relative_error for r in rows),
                            mean_abs_relative_error=mean(abs(r.relative_error) for r in rows))

