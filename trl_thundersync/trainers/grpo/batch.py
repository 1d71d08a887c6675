"""The record one streamed GRPO logical batch leaves behind (`ThunderSyncGRPOTrainer._run_logical_batch`): what the
optimizer step's trace and passes 2..μ of `num_iterations` need, instead of state left on the trainer; and the
barrier's `Collectives` over the trainer's accelerator and learner placement."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...streaming.barrier import Collectives
from ..lifecycle import StepRecord
from .entropy import EntropyBatch
from .iterations import RecordedLogProbs


@dataclass(frozen=True)
class OpenBatch:
    """One logical batch after its barrier, before its optimizer step."""

    step: StepRecord  # version, totals, timing and scored sources: the step trace's input (`lifecycle.py`)
    permutation: list[int]  # TRL's shuffle of the batch's rows: its micro-batches, reused by passes 2..μ
    entropy: EntropyBatch | None  # the entropy bonus the batch applied (None: TRL adds none)
    recorded_logps: RecordedLogProbs | None  # θ_k's log-probs kept from the streamed forwards (num_iterations > 1)
    advantages: tuple[float, ...]  # TRL's per-row advantages (rows in index order)
    loss: torch.Tensor  # the loss value TRL reports for the batch (scalar, on the training device)


def accelerator_collectives(accelerator: Any, placement: Callable[[], Any]) -> Collectives:
    """The barrier's collectives over `accelerator` (accelerate's `reduce`, `gather` on its device) and the learner
    placement (`placement()`, resolved at the hand-over: it is built lazily, at the first batch)."""
    return Collectives(
        sum=lambda t: accelerator.reduce(t.to(accelerator.device), reduction="sum"),
        gather=lambda t: accelerator.gather(t.to(accelerator.device)),
        hand_over=lambda direction, label: placement().hand_over(direction, label))
