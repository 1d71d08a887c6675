"""TRL 1.16's entropy bonus (`entropy_coef`, `use_adaptive_entropy`) at the ThunderSync barrier.

TRL subtracts `apply_coef · Σ_t m·H / max(N_b, 1) / GA` in every micro-batch b (`GRPOTrainer._compute_loss`). Each
trajectory's E_i = ∇ Σ_t m·(−apply_coef)·H is computed by its own backward (`streaming/source.py`, per turn in
`streaming/turn_grpo.py`) and summed per TRL micro-batch by the learner; here each micro-batch's sum gets its
normalizer 1/(max(N_b, 1)·GA) (`normalization.entropy_scales`, applied with the bonus's value by `streaming.barrier`),
TRL's `entropy`, `policy_loss` and `entropy_coef` metrics are produced, and adaptive entropy's coefficient is
updated once per optimizer step from the generation batch's token-weighted entropy summed over processes. The
coefficient's state stays TRL's own (`entropy_coef`, `_last_world_entropy` on the trainer, which assigns what
`entropy_step` returns), so TRL's checkpoint hooks save and restore it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...streaming.barrier import Collectives, EntropyNormalizers
from ...streaming.loss_types import loss_type
from ...streaming.normalization import entropy_scales, micro_batch_of
from .settings import EntropySettings


@dataclass(frozen=True)
class EntropyBatch:
    """The bonus of one generation batch: the coefficient every micro-batch applies and TRL's partition."""

    coef: float  # apply_coef: the value from the end of the previous step (0 while adaptive entropy is gated off)
    micro_batch: dict[int, int]  # row → TRL micro-batch (`normalization.micro_batch_of`)
    micro_batches: int  # GA = steps_per_generation

    def tokens(self, scored_tokens) -> dict[int, int]:
        """N_b: loss tokens of every TRL micro-batch b of this process."""
        counts = {b: 0 for b in range(self.micro_batches)}
        for index, n in enumerate(scored_tokens):
            counts[self.micro_batch[index]] += n
        return counts


def entropy_batch(settings: EntropySettings, coef: float, last_world_entropy: float, permutation: list[int],
                  micro_batches: int) -> EntropyBatch | None:
    """The bonus of the batch about to start (None: TRL adds none), as TRL reads it for every micro-batch: `coef` is
    TRL's `entropy_coef`, `last_world_entropy` its `_last_world_entropy` (the adaptive gate)."""
    if not settings.enabled:
        return None
    coef = float(coef)
    if settings.adaptive and not last_world_entropy <= settings.target:
        coef = 0.0
    return EntropyBatch(coef, micro_batch_of(permutation, micro_batches), micro_batches)


def entropy_normalizers(batch: EntropyBatch, totals) -> EntropyNormalizers:
    """The bonus at the barrier (`streaming.barrier`): N_b of this process and 1/(max(N_b, 1)·GA) per micro-batch."""
    tokens = batch.tokens(totals.scored_tokens)
    return EntropyNormalizers(batch.coef, batch.micro_batch, tokens, entropy_scales(tokens, batch.micro_batches))


@dataclass(frozen=True)
class EntropyStep:
    """TRL's entropy metrics of one optimizer step and its adaptive coefficient's new state."""

    entropy: list[float]  # TRL's `entropy` per micro-batch, global over processes
    policy_loss: list[float]  # TRL's `policy_loss` per micro-batch, the mean over processes
    coef: float  # `entropy_coef` after the step (the adaptive update applied)
    world_entropy: float | None  # the new `_last_world_entropy` (None: not adaptive, unchanged)

    def record(self, metrics) -> None:
        """Into TRL's `_metrics["train"]`: `entropy`, `policy_loss` and the coefficient after the step."""
        metrics["entropy"].extend(self.entropy)
        metrics["policy_loss"].extend(self.policy_loss)
        metrics["entropy_coef"].append(self.coef)


def entropy_step(settings: EntropySettings, kind: str, coef: float, bonus: EntropyNormalizers, policy_terms,
                 entropy_sums, collectives: Collectives) -> EntropyStep:
    """TRL's `entropy`, `policy_loss` metrics and the adaptive update, once per optimizer step (`kind`: the
    loss_type, `coef`: TRL's `entropy_coef` before the step).

    `policy_terms[i]` is trajectory i's share of the policy loss value, s_b·(free_i − A_i·V_i) as TRL computes it at
    ratio 1 (`streaming.barrier.policy_loss_terms`); `entropy_sums[i]` its Σ_t m H."""
    ga = len(bonus.tokens)
    sums, policy = bonus.sums(entropy_sums), bonus.sums(policy_terms)
    if not loss_type(kind).policy_metric_per_micro_batch:  # TRL: policy_loss after its /GA
        policy = [ga * v for v in policy]
    stats = torch.tensor([[sums[b], float(bonus.tokens[b])] for b in range(ga)], dtype=torch.float64)
    world = collectives.sum(stats).cpu()
    entropy = (world[:, 0] / world[:, 1].clamp(min=1.0)).tolist()  # per micro-batch, global over ranks
    gathered = collectives.gather(torch.tensor(policy, dtype=torch.float32))
    policy_loss = gathered.view(-1, ga).nanmean(dim=0).tolist()
    world_entropy = None
    if settings.adaptive:  # once per optimizer step, as TRL's sync_gradients branch
        window = world.sum(dim=0)
        world_entropy = float(window[0] / window[1].clamp(min=1.0))
        if world_entropy <= settings.target:
            coef = min(coef + settings.delta, settings.maximum)
        else:
            coef = max(coef - settings.delta, settings.minimum)
    return EntropyStep(entropy, policy_loss, coef, world_entropy)
