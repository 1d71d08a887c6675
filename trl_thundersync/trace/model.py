"""The scheduling model of paper Appendix F: replay a recorded step, closed forms, and the analytic release model.

Pure functions on floats, one import point for the whole model. Three layers, top to bottom, each in its module:

1. Trace replay (`replay.py`; Eq. 1–2 = Eq. 14, closed form Eq. 15): push the learner items' (τ_j, p_j) through one
   learner lane and predict the step time T = max(R, c_n) + P; Sync would take R + L + P (Eq. 16).
   `predict_release` (`releases.py`) replays one trace under every GRPO release point (reward, content readiness,
   per turn): a trajectory's service is the same, only its τ moves (its reward time, its content-ready time, its
   turn ends).
2. Closed forms (`closed_forms.py`): the Sync speedup (Eq. 16), its 2× bound (Eq. 17), the full-overlap limit
   (1 + ρ)/max(1, ρ) (§F.3), and the tail of a finite trace from its release fraction (Eq. 18–20).
3. The analytic release model (`analytic.py`) used for the paper's what-if surfaces: GRPO and OPD release laws
   (Eq. 21–24), plugged into Eq. 19, stacked over rollout waves (Eq. 25–26) with the plotting rule for batch size
   (Eq. 28).

Notation (paper): R rollout time, L = Σ p_j learner service, P serial suffix (reduction, optimizer, publication),
ρ = L/R balance ratio, κ = P/R suffix ratio, λ_K = [c_n − R]⁺/R normalized learner tail.
"""

from __future__ import annotations

from .analytic import (
    PAPER_CAPACITY,
    PAPER_CLOSURE_FRACTION,
    PAPER_DEFERRED_FRACTION,
    PAPER_GROUP_SIZE,
    PAPER_SERVICE_EXPONENT,
    PAPER_SUFFIX_RATIO,
    PAPER_TURNS,
    SweepPoint,
    analytic_point,
    analytic_speedup,
    grpo_release_fraction,
    opd_release_fraction,
    plotting_waves,
    release_lag,
    release_tail,
    sweep,
    wave_speedup,
)
from .closed_forms import (
    full_overlap_limit,
    speedup_upper_bound,
    sync_speedup,
    tail_bounds,
    trace_release_lag,
    trace_tail,
)
from .releases import RELEASE_MODES, TrajectoryWork, predict_release, predict_releases, release_items, trajectory_work
from .replay import (
    PredictionReport,
    Replay,
    StepPrediction,
    completion_closed_form,
    predicted_vs_measured,
    relative_items,
    replay,
    replay_step,
)

__all__ = [
    "PAPER_CAPACITY", "PAPER_CLOSURE_FRACTION", "PAPER_DEFERRED_FRACTION", "PAPER_GROUP_SIZE", "PAPER_SERVICE_EXPONENT",
    "PAPER_SUFFIX_RATIO", "PAPER_TURNS", "RELEASE_MODES", "PredictionReport", "Replay", "StepPrediction", "SweepPoint",
    "TrajectoryWork", "analytic_point", "analytic_speedup", "completion_closed_form", "full_overlap_limit",
    "grpo_release_fraction", "opd_release_fraction", "plotting_waves", "predict_release", "predict_releases",
    "predicted_vs_measured", "relative_items", "release_items", "release_lag", "release_tail", "replay", "replay_step",
    "speedup_upper_bound", "sweep", "sync_speedup", "tail_bounds", "trace_release_lag", "trace_tail",
    "trajectory_work", "wave_speedup",
]
