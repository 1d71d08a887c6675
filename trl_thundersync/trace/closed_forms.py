"""Closed forms of the scheduling model (paper Appendix F): the Sync speedup (Eq. 16), its 2× bound (Eq. 17), the
full-overlap limit (1 + ρ)/max(1, ρ) (§F.3), and the tail of a finite trace from its release fraction (Eq. 18–20).

Notation as in `replay.py`: ρ = L/R balance ratio, κ = P/R suffix ratio, λ_K = [c_n − R]⁺/R normalized learner tail.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .replay import relative_items


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
    checked = relative_items(items, start)
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
    checked = sorted(relative_items(items, start))
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

