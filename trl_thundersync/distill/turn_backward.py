"""Per-turn student backward of on-policy distillation: one loss channel over the shared per-turn core.

The machinery (the naive full-context backward and the linear-cost boundary-cut backward with deferred state
adjoints) lives in `streaming.segment_backward`, shared with the GRPO per-turn release; this module binds it to the
distillation objective (student logits, actions, teacher scores) and one `GradientSum`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..streaming.gradient_sinks import GradientSum
from ..streaming.segment_backward import BoundaryCut, FullContext
from ..types import TurnEvent
from .records import TeacherScores

__all__ = ["BoundaryCutBackward", "GradientSum", "NaiveTurnBackward", "TurnBackward", "TurnObjective", "TurnOutcome"]

# (student logits (T, V) at the action positions, actions (T,), teacher scores) -> scalar loss summed over tokens
TurnObjective = Callable[[torch.Tensor, torch.Tensor, TeacherScores], torch.Tensor]

_CHANNEL = "loss"


@dataclass(frozen=True)
class TurnOutcome:
    loss_value: float  # Σ_t of the per-token loss value (before normalization)
    scored_tokens: int  # |M_j|
    forwarded_tokens: int  # tokens run through the student for this turn (the work it cost)


class TurnBackward(Protocol):
    """What the distillation learner calls: `turn` once per turn in order, `close` once per trajectory."""

    def turn(self, event: TurnEvent, teacher: TeacherScores) -> TurnOutcome: ...

    def close(self, index: int) -> int: ...  # returns the context tokens replayed


class _OneChannel:
    core_cls: type = FullContext

    def __init__(self, model: Any, params: Sequence[torch.Tensor], objective: TurnObjective, grads: GradientSum,
                 device: torch.device | str = "cpu") -> None:
        self.core = self.core_cls(model, params, device)
        self.objective, self.grads = objective, grads

    @property
    def open(self) -> dict:
        """Trajectories holding per-turn state (boundary-cut graphs and adjoints)."""
        return self.core.open

    def turn(self, event: TurnEvent, teacher: TeacherScores) -> TurnOutcome:
        outcome = self.core.turn(event, lambda logits, actions: {_CHANNEL: self.objective(logits, actions, teacher)},
                                 {_CHANNEL: self.grads}, f"trajectory {event.index} turn {event.turn}")
        return TurnOutcome(outcome.values.get(_CHANNEL, 0.0), outcome.scored_tokens, outcome.forwarded_tokens)

    def close(self, index: int) -> int:
        return self.core.close(index, {_CHANNEL: self.grads})


class NaiveTurnBackward(_OneChannel):
    """Reference: every turn re-runs its whole context (`segment_backward.FullContext`)."""

    core_cls = FullContext


class BoundaryCutBackward(_OneChannel):
    """Linear-cost per-turn backward with deferred state adjoints (`segment_backward.BoundaryCut`)."""

    core_cls = BoundaryCut
