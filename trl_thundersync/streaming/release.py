"""When GRPO learner work is released: at the reward (the paper), at content readiness, or turn by turn.

    H_i = ∇ Σ_t m_it u_i log π(o_it)        needs the trajectory's tokens, not its reward R_i

so a trajectory's score gradient can be computed before R_i exists and *bound* to it later (G1 += (R_i − c) H_i,
G2 += H_i; `accumulators.py`). Release points (`ThunderSyncGRPOConfig.release`):

- `"reward"`:  the backward runs once the reward is known (paper §3.4). No extra memory.
- `"content"`: the backward runs when the trajectory's last turn ended, while it is graded / its group's or the
  batch's reward call waits; H_i waits in a per-trajectory FP32 buffer until the reward binds.
- `"turn"`:    each agentic turn's action tokens get their backward while that turn's tool runs (boundary-cut
  backward with deferred state adjoints, linear in the number of turns); at the last turn the deferred adjoints are
  replayed and per-trajectory scalars known only then (u_i, truncation masking, sequence-level importance weights)
  are applied; then as `"content"`. A trajectory whose turns cannot be reproduced exactly from its final tokens falls
  back to one whole-trajectory backward at content readiness — never to an approximation.

Admission: at most `max_buffered_trajectories` trajectories hold a buffer (or per-turn state) at once, so the extra
memory is ≤ 4·m·P bytes of buffers (m the cap, P trainable parameters; ×2 with β ≠ 0 under `"turn"`, whose KL term
also waits for the last turn) plus, under `"turn"`, the retained per-turn graphs of open trajectories. A trajectory
that finds no slot is released at its reward, as under `"reward"`. Every path computes the same numbers.

Adaptive turn release (`adaptive_turn_release`, `step_release`): a turn learned as it ends costs more than its share
of one whole-trajectory pass (its segment is back-propagated again at the trajectory's close, and every call has a
fixed cost: ~1.2–2× the learner time on `--preset quick-grading`), which pays only where the learner would otherwise
idle. A step after one whose learner was busy for at least `LEARNER_BOUND` of its rollout runs as `"content"`; after
a step that ran as `"content"`, per-turn release resumes only below `TURN_ENTRY` of the rollout (a band: released per
turn, that step's learner would cost ~1.3× more and cross `LEARNER_BOUND` again, alternating the two).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, get_args

import torch

from ..types import ReleasePoint, Rollout, TurnEvent
from .learner_records import SourceGradients

if TYPE_CHECKING:
    from .learner_records import BatchTiming

RELEASE_POINTS: tuple[ReleasePoint, ...] = get_args(ReleasePoint)
# adaptive turn release: the learner bounded a step whose learner was busy for at least this fraction of its rollout
# (start to the last reward). Learned as they end, turns cost up to ~1.25× the learner time of content release on
# quick-grading: above ~3/4 of the rollout that extra no longer fits in it; below, the learner idles anyway.
LEARNER_BOUND = 0.75
# ... and after a step that ran as content release, per-turn release resumes only where that step's learner was busy
# for less than this fraction: released per turn, a step's learner is busy ~1.3× longer (quick-grading: 1.13–1.19 of
# the rollout against 0.81–0.97 for content release in the same runs), so from 0.55 it would cross LEARNER_BOUND again
TURN_ENTRY = 0.55


def step_release(release: str, adaptive: bool, previous: BatchTiming | None) -> str:
    """The release point of one step: `"content"` instead of `"turn"` where `adaptive` and the previous step's
    learner bounded it (busy ≥ `LEARNER_BOUND` of its rollout, or ≥ `TURN_ENTRY` when that step already ran as
    content release); the first step releases per turn."""
    if release != "turn" or not adaptive or previous is None:
        return release
    rollout = previous.rollout_end - previous.start
    bound = TURN_ENTRY if previous.turns_released is False else LEARNER_BOUND
    return "content" if rollout > 0 and previous.learner_busy >= bound * rollout else release


class TurnSource(Protocol):
    """Per-turn GRPO backward (`turn_grpo.py`): `turn` per turn in order, then `finish` or `discard` once. An
    optional `last_flops` attribute prices the last call's passes for the trace (absent or None: by tokens)."""

    def turn(self, event: TurnEvent) -> int: ...  # tokens forwarded

    def turns(self, events: Sequence[TurnEvent]) -> int: ...  # consecutive turns of one trajectory, one segment

    def finish(self, rollout: Rollout, bucket: int) -> SourceGradients | None: ...  # None: history mismatch

    def discard(self, index: int) -> None: ...

    def held_bytes(self) -> int: ...


@dataclass(frozen=True)
class Buffered:
    """A trajectory whose gradients were computed at content readiness and wait for its reward."""

    grads: SourceGradients  # H_i (score_grad) and K_i (already folded into the batch accumulator)
    content_ready: float  # perf_counter when its tokens were fixed


def vector_bytes(grads: SourceGradients) -> int:
    return sum(v.numel() * v.element_size() for v in (grads.score_grad,) if isinstance(v, torch.Tensor))


def check_learner_arguments(batch_size: int, num_generations: int, release: str,
                     content_backward: Callable[[Rollout, int], SourceGradients] | None,
                     turn_source: TurnSource | None) -> None:
    """`GRPOBatchLearner`'s refusals: whole groups only, a known release point, and its backward must be there."""
    if batch_size % num_generations:
        raise ValueError(f"batch_size={batch_size} is not a multiple of num_generations={num_generations}")
    if release not in RELEASE_POINTS:
        raise ValueError(f"release={release!r} is not one of {RELEASE_POINTS}")
    if release != "reward" and content_backward is None:
        raise ValueError(f"release={release!r} needs a content_backward")
    if release == "turn" and turn_source is None:
        raise ValueError("release='turn' needs a turn_source")
