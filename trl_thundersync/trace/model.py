"""The scheduling model of paper Appendix F: replay a recorded step, closed forms, and the analytic release model.

Pure functions on floats. Three layers, top to bottom:

1. Trace replay (Eq. 1–2 = Eq. 14, closed form Eq. 15): push the learner items' (τ_j, p_j) through one learner lane
   and predict the step time T = max(R, c_n) + P; Sync would take R + L + P (Eq. 16). `predict_release` replays
   one trace under every GRPO release point (reward, content readiness, per turn): a trajectory's service is the
   same, only its τ moves (its reward time, its content-ready time, its turn ends).
2. Closed forms: the Sync speedup (Eq. 16), its 2× bound (Eq. 17), the full-overlap limit (1 + ρ)/max(1, ρ) (§F.3),
   and the tail of a finite trace from its release fraction (Eq. 18–20).
3. The analytic release model used for the paper's what-if surfaces: GRPO and OPD release laws (Eq. 21–24), plugged
   into Eq. 19, stacked over rollout waves (Eq. 25–26) with the plotting rule for batch size (Eq. 28).

Notation (paper): R rollout time, L = Σ p_j learner service, P serial suffix (reduction, optimizer, publication),
ρ = L/R balance ratio, κ = P/R suffix ratio, λ_K = [c_n − R]⁺/R normalized learner tail.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

from .records import StepTrace

# Appendix F.5: the parameters of the paper's analytic sweeps (Figures 7b, 9, 10).
PAPER_CAPACITY = 128.0  # Q: trajectories one rollout wave holds
PAPER_GROUP_SIZE = 8  # m: GRPO group size
PAPER_CLOSURE_FRACTION = 0.02  # β: GRPO service that waits for the whole group
PAPER_DEFERRED_FRACTION = 0.45  # δ: OPD service deferred to trajectory completion
PAPER_SERVICE_EXPONENT = 0.49  # γ: learner service of a trajectory completing at U is ∝ U^γ
PAPER_SUFFIX_RATIO = 0.05  # κ_w = P/W
PAPER_TURNS = 40  # a: OPD turns per trajectory (the batch-size grid of §F.5 uses 40 turns)


# --- 1. Trace replay -------------------------------------------------------------------------------------------


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


def _check_items(items: Iterable[tuple[float, float]], start: float) -> list[tuple[float, float]]:
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
    checked = _check_items(items, start)
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
    checked = _check_items(items, start)
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


# --- 1b. Every release point from one trace --------------------------------------------------------------------

RELEASE_MODES = ("reward", "content", "turn")  # ThunderSyncGRPOConfig.release
_WORK_KINDS = ("source_backward", "content_backward", "turn_backward", "turn_close")  # a trajectory's own service


@dataclass(frozen=True)
class TrajectoryWork:
    """What one trajectory of a recorded step asks of the learner, independent of when it was released."""

    index: int
    group: int
    content_ready: float  # its last turn ended (absolute seconds)
    reward_at: float  # its reward was known
    service: float  # Σ service of its backward items (whole, per turn, and the turn close), s
    bind_service: float  # Σ service of its bind items (0 in a trace without binds)
    turns: tuple[tuple[float, float], ...]  # (release time, service) per turn, summing to `service`; () if unknown


def _first(values: Iterable[float | None]) -> float | None:
    return next((v for v in values if v is not None), None)


def trajectory_work(step: StepTrace) -> dict[int, TrajectoryWork]:
    """Per trajectory index: its learner service and its content-ready, reward and turn-end times.

    Times come from the learner items' `content_ready` / `reward_at`; for traces without them (written before those
    fields existed), from the rollout lane: the trajectory's end is its content-ready time, its "reward" interval's
    end its reward time (else the `ready` of its reward-released backward). Turns: a turn-released trace's own
    "turn_backward" items (τ = turn end, their measured service; the turn close is released with the content);
    otherwise the rollout lane's "turn" events, the trajectory's service split over them in proportion to each
    turn's action tokens (evenly when the trace has no token counts), each released at its turn's end.
    """
    learner = [e for e in step.events if e.lane == "learner" and e.index >= 0 and e.kind in _WORK_KINDS + ("bind",)]
    by_index: dict[int, list] = {}
    for e in learner:
        by_index.setdefault(e.index, []).append(e)
    finished = {e.index: e.end for e in step.events if e.lane == "rollout" and e.kind == "trajectory"}
    scored = {e.index: e.end for e in step.events if e.lane == "rollout" and e.kind == "reward"}
    turn_events: dict[int, list] = {}
    for e in step.events:
        if e.lane == "rollout" and e.kind == "turn":
            turn_events.setdefault(e.index, []).append(e)
    out = {}
    for index, items in by_index.items():
        content = _first([e.content_ready for e in items] + [finished.get(index)])
        reward = _first([e.reward_at for e in items] + [scored.get(index)]
                        + [e.ready for e in items if e.kind in ("source_backward", "bind")])
        if content is None:
            content = _first(e.ready for e in items if e.kind == "content_backward")
        if content is None or reward is None:
            raise ValueError(f"step {step.step}: trajectory {index} has no content-ready or reward time in the trace")
        content = min(content, reward)  # a trajectory's tokens are fixed by the time it is graded
        work = [e for e in items if e.kind in _WORK_KINDS]
        service = math.fsum(e.end - e.start for e in work)
        bind = math.fsum(e.end - e.start for e in items if e.kind == "bind")
        own_turns = sorted((e for e in work if e.kind == "turn_backward"), key=lambda e: (e.turn, e.start))
        if own_turns:
            close = math.fsum(e.end - e.start for e in work if e.kind != "turn_backward")
            turns = tuple((min(e.ready if e.ready is not None else e.start, content), e.end - e.start)
                          for e in own_turns) + ((content, close),)
        elif turn_events.get(index):
            events = sorted(turn_events[index], key=lambda e: (e.turn, e.start))
            total = sum(e.tokens for e in events)
            shares = [e.tokens / total for e in events] if total > 0 else [1.0 / len(events)] * len(events)
            turns = tuple((min(e.end, content), service * share) for e, share in zip(events, shares))
        else:
            turns = ()
        out[index] = TrajectoryWork(index=index, group=items[0].group, content_ready=content, reward_at=reward,
                                    service=service, bind_service=bind, turns=turns)
    return out


def release_items(step: StepTrace, mode: str) -> list[tuple[float, float]]:
    """The step's learner work as (τ_j, p_j) in readiness order, had it been released at `mode`.

    - "reward":  each trajectory's service (and its bind's) at its reward time — the paper's release;
    - "content": its service at its content-ready time, then a bind item (its measured bind service, 0 if the
      trace has none) at its reward time;
    - "turn":    its per-turn shares (`trajectory_work`) at their turn ends, then the bind at the reward time; a
      trajectory without turn information is released as under "content".
    A group fold (its measured service) is released when its group's last reward is known, in every mode; other
    items (stock TRL's whole-batch item) keep their recorded `ready`. Ties keep trajectory work before binds before
    folds, so one FIFO lane in readiness order respects every dependency.
    """
    if mode not in RELEASE_MODES:
        raise ValueError(f"mode={mode!r}: expected one of {RELEASE_MODES}")
    work = trajectory_work(step)
    keyed: list[tuple[float, int, int, float]] = []  # (τ, rank, index, p)
    for w in work.values():
        if mode == "reward":
            keyed.append((w.reward_at, 0, w.index, w.service + w.bind_service))
            continue
        if mode == "turn" and w.turns:
            keyed.extend((tau, 0, w.index, p) for tau, p in w.turns)
        else:
            keyed.append((w.content_ready, 0, w.index, w.service))
        keyed.append((w.reward_at, 1, w.index, w.bind_service))
    last_reward: dict[int, float] = {}
    for w in work.values():
        last_reward[w.group] = max(last_reward.get(w.group, w.reward_at), w.reward_at)
    for e in step.events:
        if e.lane != "learner" or (e.index >= 0 and e.kind in _WORK_KINDS + ("bind",)):
            continue
        if e.kind == "group_fold" and e.group in last_reward:
            keyed.append((last_reward[e.group], 2, -1, e.end - e.start))
        else:
            keyed.append((e.ready if e.ready is not None else e.start, 2, -1, e.end - e.start))
    return [(tau, p) for tau, _, _, p in sorted(keyed)]


def predict_release(step: StepTrace, mode: str) -> Replay:
    """Replay one recorded step (Eq. 14) as if its learner work had been released at `mode`
    ("reward" | "content" | "turn", `release_items`), with the step's own R and serial suffix P.

    `.thundersync_time` is the predicted step time T = max(R, c_n) + P, `.sync_time` = R + L + P (every item at
    R), `.speedup` their ratio: the predicted speedup of that release point over `sync`. Any schedule's trace
    works: a sync trace gives every mode's prediction before running it.
    """
    suffix = max(0.0, step.publish_end - max(step.rollout_end, step.learner_end))
    return replay(release_items(step, mode), step.rollout_end, suffix, step.start)


def predict_releases(step: StepTrace) -> dict[str, Replay]:
    """`predict_release` for every release mode."""
    return {mode: predict_release(step, mode) for mode in RELEASE_MODES}


# --- 2. Closed forms ---------------------------------------------------------------------------------------------


def sync_speedup(balance_ratio: float, tail_ratio: float, suffix_ratio: float) -> float:
    """S_Sync = (1 + ρ + κ) / (1 + λ_K + κ) (Eq. 16)."""
    return (1.0 + balance_ratio + suffix_ratio) / (1.0 + tail_ratio + suffix_ratio)


def speedup_upper_bound(rollout: float, learner: float, suffix: float) -> float:
    """(R + L + P) / (max(R, L) + P) ≤ 2 (Eq. 17): no overlap schedule beats both stages running fully in parallel.

    Equals 2 only when R = L and P = 0; any learner tail lowers the achievable speedup further.
    """
    return (rollout + learner + suffix) / (max(rollout, learner) + suffix)


def full_overlap_limit(balance_ratio: float) -> float:
    """(1 + ρ) / max(1, ρ): the many-wave limit of Eq. 26 (§F.3), 2 at ρ = 1 and symmetric in log ρ."""
    return (1.0 + balance_ratio) / max(1.0, balance_ratio)


def trace_tail(items: Sequence[tuple[float, float]], rollout_end: float, start: float = 0.0) -> float:
    """λ_K of a finite trace from its release fraction F⁻ (Eq. 18–19), exactly.

    1 + λ_K = max(1, sup_u u + ρ[1 − F⁻(u)]). F⁻ counts service released strictly before uR, so between releases
    the expression grows with u and its supremum is attained at a release time u_k = τ_k/R, where it equals
    (τ_k + Σ_{τ_i ≥ τ_k} p_i)/R. Requires 0 ≤ τ_j − start ≤ R (the release laws' assumption, Appendix F.1).
    """
    r = rollout_end - start
    checked = _check_items(items, start)
    if r <= 0 or any(tau > r for tau, _ in checked):
        raise ValueError("Eq. 19 needs R > 0 and every ready time within the rollout window [start, rollout_end]")
    best, after = r, 0.0
    for tau, p in sorted(checked, reverse=True):  # latest release first: `after` = service released at ≥ τ
        after += p
        best = max(best, tau + after)
    return best / r - 1.0


def trace_release_lag(items: Sequence[tuple[float, float]], rollout_end: float, start: float = 0.0) -> float:
    """D = sup_{0≤u≤1} [u − F⁻(u)] of a finite trace (Eq. 20): how far service release lags a uniform release.

    u − F⁻(u) grows between releases, so the supremum sits at a release time (before its own jobs count) or at u = 1.
    """
    r = rollout_end - start
    checked = sorted(_check_items(items, start))
    total = math.fsum(p for _, p in checked)
    if r <= 0 or total <= 0 or any(tau > r for tau, _ in checked):
        raise ValueError("Eq. 20 needs R > 0, positive learner service and ready times within [start, rollout_end]")
    lag, before = 0.0, 0.0
    for tau, p in checked:
        lag = max(lag, tau / r - before / total)
        before += p
    return max(lag, 1.0 - math.fsum(p for tau, p in checked if tau < r) / total)


def tail_bounds(balance_ratio: float, release_lag: float) -> tuple[float, float]:
    """[ρ − 1]⁺ ≤ λ_K ≤ [ρ − 1]⁺ + ρD (Eq. 20); at ρ = 1 the tail equals D."""
    floor = max(0.0, balance_ratio - 1.0)
    return floor, floor + balance_ratio * release_lag


# --- 3. Analytic release model -----------------------------------------------------------------------------------


def _sup_on_unit_interval(f: Callable[[float], float], grid: int = 2048) -> float:
    """sup_{0≤u≤1} f(u) for a continuous f: a uniform grid, then golden-section search around the best grid point."""
    values = [f(k / grid) for k in range(grid + 1)]
    k = max(range(grid + 1), key=values.__getitem__)
    lo, hi = max(0, k - 1) / grid, min(grid, k + 1) / grid
    g = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(40):  # shrink the bracket by 0.618^40 ≈ 4e-9
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        if f(a) >= f(b):
            hi = b
        else:
            lo = a
    return max(values[k], f((lo + hi) / 2.0))


def release_tail(release_fraction: Callable[[float], float], balance_ratio: float) -> float:
    """λ = max(1, sup_u u + ρ[1 − F(u)]) − 1 (Eq. 19) for a continuous release fraction F on [0, 1]."""
    peak = _sup_on_unit_interval(lambda u: u + balance_ratio * (1.0 - release_fraction(u)))
    return max(1.0, peak) - 1.0


def release_lag(release_fraction: Callable[[float], float]) -> float:
    """D = sup_u [u − F(u)] (Eq. 20) for a continuous release fraction F on [0, 1]."""
    return max(0.0, _sup_on_unit_interval(lambda u: u - release_fraction(u)))


def grpo_release_fraction(u: float, group_size: int = PAPER_GROUP_SIZE,
                          closure_fraction: float = PAPER_CLOSURE_FRACTION,
                          service_exponent: float = PAPER_SERVICE_EXPONENT) -> float:
    """F_GRPO(u) = (1 − β) u^(γ+1) + β u^(γ+m) (Eq. 22).

    Completion U ~ Uniform(0, 1) with service ∝ U^γ gives H(u) = u^(γ+1) (Eq. 21); the fraction β of service that
    waits for all m group members is released with probability u^(m−1) more.
    """
    g, b = service_exponent, closure_fraction
    return (1.0 - b) * u ** (g + 1.0) + b * u ** (g + group_size)


def opd_release_fraction(u: float, turns: float = PAPER_TURNS, deferred_fraction: float = PAPER_DEFERRED_FRACTION,
                         service_exponent: float = PAPER_SERVICE_EXPONENT) -> float:
    """F_OPD(u) = (1 − δ)/a Σ_{j=1..a} min(1, (au/j)^(γ+1)) + δ u^(γ+1) (Eq. 24).

    a equal-service turns of a trajectory completing at U release at jU/a. `turns=math.inf` uses the paper's limit
    of the turn sum: u(1 + 1/γ) − u^(γ+1)/γ for γ > 0, u(1 − log u) for γ = 0 (0 at u = 0).
    """
    g, d = service_exponent, deferred_fraction
    if math.isinf(turns):
        if u <= 0.0:
            turn_part = 0.0
        elif g == 0.0:
            turn_part = u * (1.0 - math.log(u))
        else:
            turn_part = u * (1.0 + 1.0 / g) - u ** (g + 1.0) / g
    else:
        a = int(turns)
        turn_part = math.fsum(min(1.0, (a * u / j) ** (g + 1.0)) for j in range(1, a + 1)) / a
    return (1.0 - d) * turn_part + d * u ** (g + 1.0)


def wave_speedup(waves: float, balance_ratio: float, tail_ratio: float, suffix_ratio: float) -> float:
    """S_Sync(w) = [w(1 + ρ_w) + κ_w] / [w max(1, ρ_w) + κ_w − [ρ_w − 1]⁺ + λ_w] (Eq. 26).

    w identical full waves launched every W; maximizing Eq. 25 over waves picks the last wave when ρ_w ≤ 1 and the
    first when ρ_w > 1. At balance (2w + κ_w)/(w + κ_w + λ_w) → 2; otherwise → (1 + ρ_w)/max(1, ρ_w) as w grows.
    """
    w, rho = waves, balance_ratio
    return (w * (1.0 + rho) + suffix_ratio) / (w * max(1.0, rho) + suffix_ratio - max(0.0, rho - 1.0) + tail_ratio)


def plotting_waves(batch_size: float, rollout_learner_ratio: float,
                   capacity: float = PAPER_CAPACITY) -> tuple[float, float]:
    """(w, ρ_w) = (max(1, B/Q), min(1, B/Q)/r) (Eq. 28), r = rollout time / learner time at full capacity.

    Below one full wave the learner service shrinks with occupancy, so balance moves to r ≈ B/Q.
    """
    if batch_size <= 0 or rollout_learner_ratio <= 0 or capacity <= 0:
        raise ValueError(f"batch_size={batch_size!r}, rollout_learner_ratio={rollout_learner_ratio!r} and "
                         f"capacity={capacity!r} must be > 0")
    occupancy = batch_size / capacity
    return max(1.0, occupancy), min(1.0, occupancy) / rollout_learner_ratio


@dataclass(frozen=True)
class SweepPoint:
    """One point of the analytic model (Eq. 19, 22/24, 26, 28)."""

    objective: str  # "grpo" | "opd"
    batch_size: float  # B: trajectories per optimizer step
    rollout_learner_ratio: float  # r: rollout time / learner time at full capacity
    group_size: int  # m (GRPO only)
    turns: float  # a (OPD only)
    waves: float  # w = max(1, B/Q)
    balance_ratio: float  # ρ_w = min(1, B/Q)/r
    tail_ratio: float  # λ_w from Eq. 19 with the objective's release law
    speedup: float  # S_Sync(w) of Eq. 26


def analytic_point(objective: str, batch_size: float, rollout_learner_ratio: float, *,
                   group_size: int = PAPER_GROUP_SIZE, turns: float = PAPER_TURNS,
                   capacity: float = PAPER_CAPACITY, closure_fraction: float = PAPER_CLOSURE_FRACTION,
                   deferred_fraction: float = PAPER_DEFERRED_FRACTION,
                   service_exponent: float = PAPER_SERVICE_EXPONENT,
                   suffix_ratio: float = PAPER_SUFFIX_RATIO) -> SweepPoint:
    """Evaluate the paper's analytic surface at one point: Eq. 28 → release law (Eq. 22 or 24) → Eq. 19 → Eq. 26.

    Paper symbols: B = batch_size, r = rollout_learner_ratio, m = group_size, a = turns, Q = capacity,
    β = closure_fraction, δ = deferred_fraction, γ = service_exponent, κ_w = suffix_ratio; defaults are §F.5's.
    """
    if objective == "grpo":
        if group_size < 1:
            raise ValueError(f"group_size={group_size!r} must be ≥ 1")
        law = partial(grpo_release_fraction, group_size=group_size, closure_fraction=closure_fraction,
                      service_exponent=service_exponent)
    elif objective == "opd":
        if not turns >= 1:
            raise ValueError(f"turns={turns!r} must be ≥ 1 (or math.inf)")
        law = partial(opd_release_fraction, turns=turns, deferred_fraction=deferred_fraction,
                      service_exponent=service_exponent)
    else:
        raise ValueError(f"objective={objective!r}: expected 'grpo' or 'opd'")
    waves, rho = plotting_waves(batch_size, rollout_learner_ratio, capacity)
    tail = release_tail(law, rho)
    return SweepPoint(objective=objective, batch_size=batch_size, rollout_learner_ratio=rollout_learner_ratio,
                      group_size=group_size, turns=turns, waves=waves, balance_ratio=rho, tail_ratio=tail,
                      speedup=wave_speedup(waves, rho, tail, suffix_ratio))


def analytic_speedup(objective: str, batch_size: float, rollout_learner_ratio: float, **params: float) -> float:
    """Predicted speedup over Sync of the analytic model; keyword parameters as in `analytic_point`."""
    return analytic_point(objective, batch_size, rollout_learner_ratio, **params).speedup


def sweep(objective: str, batch_sizes: Sequence[float], rollout_learner_ratios: Sequence[float], *,
          group_sizes: Sequence[int] = (PAPER_GROUP_SIZE,), turns: Sequence[float] = (PAPER_TURNS,),
          **params: float) -> list[SweepPoint]:
    """What-if grid over batch size × rollout/learner ratio × group size × turns (the surfaces of Figures 7b, 9, 10).

    Remaining keywords (capacity, closure_fraction, deferred_fraction, service_exponent, suffix_ratio) are passed to
    `analytic_point`. GRPO does not depend on turns and OPD not on group size (Appendix F.2); both axes are still
    enumerated so a grid keeps its shape.
    """
    return [analytic_point(objective, b, r, group_size=m, turns=a, **params)
            for b in batch_sizes for r in rollout_learner_ratios for m in group_sizes for a in turns]
