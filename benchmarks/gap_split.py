"""Where a ThunderSync schedule's step differs from its replay prediction, by phase of the step.

A step is T = R + [c_n − R]⁺ + P (Eq. 2): the rollout R, the learner's tail after it, and the serial suffix P
(barrier, optimizer step, publication). The replay of the sync traces at a release point (`trace.releases`) predicts
T with sync's own R and P and the tail its single lane leaves. So, in means over the measured steps,

    measured T − predicted T = (R − R_sync) + (tail − tail_replay) + (P − P_sync)

exactly, and each term says where the overlap cost time: a rollout slowed by the learner beside it (shared cores,
the GIL), learner work that outlasted the rollout (each item slower than sync's, or smaller passes), or the
barrier. Times are the traces' (admission → publication), not the callbacks' step walls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .stats import ScheduleSummary


@dataclass(frozen=True)
class GapSplit:
    """One ThunderSync schedule against its release point's replay on the sync traces, s per step (means)."""

    measured_s: float  # its mean traced step: R + tail + P
    predicted_s: float  # the replay's mean T: sync's R and P, the replayed lane's tail
    rollout_s: float  # its mean R − sync's: the rollout slowed (or sped up) beside the learner
    tail_s: float  # its mean learner tail − the replay's: learner work left after R
    suffix_s: float  # its mean P − sync's: barrier, optimizer step, publication
    learner_s: float  # its mean L − sync's (Σ learner service; context for the tail, not a term of the sum)


def gap_split(schedule: ScheduleSummary, sync: ScheduleSummary, mode: str) -> GapSplit | None:
    """`schedule`'s split against the replay of `sync`'s traces at release point `mode` (None when the sync summary
    has no replay of that mode)."""
    predicted = (sync.replay_release_s or {}).get(mode)
    tail = (sync.replay_release_tail_s or {}).get(mode)
    if predicted is None or tail is None:
        return None
    return GapSplit(measured_s=schedule.trace_wall_s, predicted_s=predicted,
                    rollout_s=schedule.rollout_s - sync.rollout_s, tail_s=schedule.learner_tail_s - tail,
                    suffix_s=schedule.suffix_s - sync.suffix_s,
                    learner_s=schedule.learner_busy_s - sync.learner_busy_s)
