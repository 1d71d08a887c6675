"""The analytic release model behind the paper's what-if surfaces (Appendix F.2–F.5, Figures 7b, 9, 10).

GRPO and OPD release laws (Eq. 21–24), plugged into Eq. 19, stacked over rollout waves (Eq. 25–26) with the plotting
rule for batch size (Eq. 28). Pure functions on floats; notation as in `replay.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

# Appendix F.5: the parameters of the paper's analytic sweeps (Figures 7b, 9, 10).
PAPER_CAPACITY = 128.0  # Q: trajectories one rollout wave holds
PAPER_GROUP_SIZE = 8  # m: GRPO group size
PAPER_CLOSURE_FRACTION = 0.02  # β: GRPO service that waits for the whole group
PAPER_DEFERRED_FRACTION = 0.45  # δ: OPD service deferred to trajectory completion
PAPER_SERVICE_EXPONENT = 0.49  # γ: learner service of a trajectory completing at U is ∝ U^γ
PAPER_SUFFIX_RATIO = 0.05  # κ_w = P/W
PAPER_TURNS = 40  # a: OPD turns per trajectory (the batch-size grid of §F.5 uses 40 turns)


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

