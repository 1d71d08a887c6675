"""TRL's off-policy sequence mask inside one streamed GRPO batch.

A trajectory whose off-policy KL (`SourceGradients.off_policy_kl`) is above the threshold keeps H_i out of its group's
G1/G2 — its reward still enters μ, σ — until the sign of its advantage is known. When its group closes it folds with
A_i ≥ 0 or is dropped (A_i < 0), as TRL's mask does; under normalize_then_sum (`objectives.py`) the sign needs the
batch mean, so the row waits for the barrier (`BatchTotals.deferred`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .accumulators import BatchAccumulator
from .learner_records import SourceGradients


class OffPolicyMask:
    """The masked rows of one batch, from their backward until their group (or, `defer`, the barrier) decides."""

    def __init__(self, threshold: float | None, defer: bool) -> None:
        self.threshold = threshold  # None: no mask (TRL's `off_policy_mask_threshold` unset)
        self.defer = defer  # normalize_then_sum: the sign of A_i is decided at the barrier
        self.masked: dict[int, tuple[int, torch.Tensor]] = {}  # index → (bucket, H_i), until its group closes
        self.deferred: list[tuple[int, int, torch.Tensor]] = []  # (index, bucket, H_i), until the barrier
        self.dropped: list[int] = []  # rows whose policy term the mask dropped

    def hold(self, index: int, bucket: int, grads: SourceGradients,
             score_grad: torch.Tensor | None) -> torch.Tensor | None:
        """The H_i to fold into the group now: None when the row is masked (then kept here until its group closes)."""
        if score_grad is not None and self.threshold is not None and grads.off_policy_kl > self.threshold:
            self.masked[index] = (bucket, score_grad)  # kept if A_i ≥ 0, dropped otherwise (TRL's mask)
            return None
        return score_grad

    def close(self, rows: range, rewards: Sequence[float], mean: float, scale: float,
              accumulator: BatchAccumulator) -> None:
        """The masked members among a closing group's `rows`: fold H_i·(R_i − μ)·scale (A_i ≥ 0), drop (A_i < 0),
        or, with `defer`, hand them to the barrier."""
        for index in rows:
            if index not in self.masked:
                continue
            bucket, vector = self.masked.pop(index)
            if self.defer:
                self.deferred.append((index, bucket, vector))
                continue
            offset = rewards[index] - mean  # sign of A_i (σ + eps > 0; a NaN scale: A_i = 0, no term)
            if not math.isfinite(scale) or not math.isfinite(offset):
                continue
            if offset < 0:
                self.dropped.append(index)
            else:
                accumulator.add_policy({bucket: vector * (offset * scale)})

    def held(self) -> int:
        """Rows holding an H_i here (they count against the learner's `max_buffered`)."""
        return len(self.masked) + len(self.deferred)

    def nbytes(self) -> int:
        return sum(v.numel() * 4 for _, v in self.masked.values()) + sum(v.numel() * 4 for *_, v in self.deferred)

    def clear(self) -> None:
        """Free every held H_i (a void batch)."""
        self.masked.clear()
        self.deferred.clear()
