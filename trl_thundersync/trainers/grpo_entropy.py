"""TRL 1.16's entropy bonus (`entropy_coef`, `use_adaptive_entropy`) at the ThunderSync barrier.

TRL subtracts `apply_coef · Σ_t m·H / max(N_b, 1) / GA` in every micro-batch b (`GRPOTrainer._compute_loss`). Each
trajectory's E_i = ∇ Σ_t m·(−apply_coef)·H is computed by its own backward (`streaming/source.py`, per turn in
`streaming/turn_grpo.py`) and summed per TRL micro-batch by the learner; here each micro-batch's sum gets its
normalizer 1/(max(N_b, 1)·GA) (`normalization.entropy_scales`, applied with the bonus's value by `streaming.barrier`),
TRL's `entropy`, `policy_loss` and `entropy_coef` metrics are produced, and adaptive entropy's coefficient is
updated once per optimizer step from the generation batch's token-weighted entropy summed over processes, with TRL's
own state (`trainer.entropy_coef`, `trainer._last_world_entropy`), so TRL's checkpoint hooks save and restore it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..streaming.barrier import EntropyNormalizers
from ..streaming.loss_types import loss_type
from ..streaming.normalization import entropy_scales, micro_batch_of


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


def entropy_batch(trainer: Any, permutation: list[int]) -> EntropyBatch | None:
    """The bonus of the batch about to start (None: TRL adds none), as TRL reads it for every micro-batch."""
    if not trainer._entropy_bonus_enabled:
        return None
    coef = float(trainer.entropy_coef)
    if trainer.use_adaptive_entropy and not trainer._last_world_entropy <= trainer.args.entropy_target:
        coef = 0.0
    ga = trainer.args.steps_per_generation
    return EntropyBatch(coef, micro_batch_of(permutation, ga), ga)


def entropy_normalizers(batch: EntropyBatch, totals) -> EntropyNormalizers:
    """The bonus at the barrier (`streaming.barrier`): N_b of this process and 1/(max(N_b, 1)·GA) per micro-batch."""
    tokens = batch.tokens(totals.scored_tokens)
    return EntropyNormalizers(batch.coef, batch.micro_batch, tokens, entropy_scales(tokens, batch.micro_batches))


def entropy_step(trainer: Any, bonus: EntropyNormalizers, policy_terms, entropy_sums) -> None:
    """TRL's `entropy`, `policy_loss`, `entropy_coef` metrics and the adaptive update, once per optimizer step.

    `policy_terms[i]` is trajectory i's share of the policy loss value, s_b·(free_i − A_i·V_i) as TRL computes it at
    ratio 1 (`streaming.barrier.policy_loss_terms`); `entropy_sums[i]` its Σ_t m H."""
    ga, device = len(bonus.tokens), trainer.accelerator.device
    sums, policy = bonus.sums(entropy_sums), bonus.sums(policy_terms)
    if not loss_type(trainer.loss_type).policy_metric_per_micro_batch:  # TRL: policy_loss after its /GA
        policy = [ga * v for v in policy]
    stats = torch.tensor([[sums[b], float(bonus.tokens[b])] for b in range(ga)], dtype=torch.float64, device=device)
    world = trainer.accelerator.reduce(stats.clone(), reduction="sum").cpu()
    m = trainer._metrics["train"]
    m["entropy"].extend((world[:, 0] / world[:, 1].clamp(min=1.0)).tolist())  # per micro-batch, global over ranks
    gathered = trainer.accelerator.gather(torch.tensor(policy, dtype=torch.float32, device=device))
    m["policy_loss"].extend(gathered.view(-1, ga).nanmean(dim=0).tolist())
    if trainer.use_adaptive_entropy:  # once per optimizer step, as TRL's sync_gradients branch
        args = trainer.args
        window = world.sum(dim=0)
        world_entropy = float(window[0] / window[1].clamp(min=1.0))
        if world_entropy <= args.entropy_target:
            trainer.entropy_coef = min(trainer.entropy_coef + args.entropy_coef_delta, args.entropy_coef_max)
        else:
            trainer.entropy_coef = max(trainer.entropy_coef - args.entropy_coef_delta, args.entropy_coef_min)
        trainer._last_world_entropy = world_entropy
    m["entropy_coef"].append(trainer.entropy_coef)
