"""The GRPO batch barrier's math: from the learner's totals to this process's batch direction and loss value.

`grpo_barrier` is pure: it runs after the collectives (the global loss-token count, the rewards gathered for the
batch statistics, `advantages.py`) and before the cross-process mean, the non-finite check and the write into
`param.grad`. `close_grpo_batch` is the one call the trainer makes: it runs those collectives through a small
`Collectives` object (the trainer's accelerator and placement, or a test's), then `grpo_barrier`, then the hand-over.
For bucket b (a TRL micro-batch for bnpo with several micro-batches, else 0) with barrier scalar s_b
(`LossNormalization.bucket_scales`) the direction is

    d = Σ_b s_b · (−policy_scale · (P_b − policy_offset · Q_b) − F_b + K_b)  (+ router term) (+ Σ_b e_b E_b)

(`BatchAccumulator.direction`; F_b holds the off-policy masked rows that waited for the batch mean, decided here),
plus the MoE router term and TRL's entropy bonus with its per-micro-batch normalizers e_b (`EntropyNormalizers`).
The loss value is TRL's at ratio 1: Σ_i s_{b(i)} · (free_i − A_i · g(A_i) · V_i), plus the bonus's and the router
term's values (`policy_loss_terms`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from .advantages import Advantages, batch_advantages, statistics_rewards
from .learner_records import BatchTotals
from .normalization import LossNormalization


@dataclass(frozen=True)
class EntropyNormalizers:
    """TRL's entropy bonus of one batch at the barrier (`trainers/grpo/entropy.py` builds it)."""

    coef: float  # apply_coef: the coefficient every micro-batch of this batch applied
    micro_batch: Mapping[int, int]  # row → TRL micro-batch
    tokens: dict[int, int]  # N_b: this process's loss tokens of every micro-batch b (all of 0..GA−1)
    scales: dict[int, float]  # e_b = 1/(max(N_b, 1)·GA): the normalizer of micro-batch b's Σ E_i

    def value(self, entropy_sums: tuple[float, ...]) -> float:
        """The bonus's loss value: −coef · Σ_b (Σ_{i∈b} Σ_t m H) / max(N_b, 1) / GA."""
        ga = len(self.tokens)
        return -self.coef * sum(s / max(self.tokens[b], 1) for b, s in enumerate(self.sums(entropy_sums))) / ga

    def sums(self, values) -> list[float]:
        """Σ_{i∈b} values[i] for every micro-batch b, in row order."""
        out = [0.0] * len(self.tokens)
        for index, value in enumerate(values):
            out[self.micro_batch[index]] += value
        return out


@dataclass(frozen=True)
class PolicyValueRule:
    """What the loss value of the policy term needs beyond the normalization: sapo's gate slope."""

    sapo_temperatures: tuple[float, float] | None = None  # sapo: (τ_+, τ_−); g(A) = 2/τ by the sign of A


@dataclass(frozen=True)
class Collectives:
    """The cross-process operations of the barrier (the trainer builds them from its accelerator; with one process
    they return their input, and a test can hand in a failing one). Tensors go in on the CPU."""

    sum: Callable[[torch.Tensor], torch.Tensor]  # the elementwise sum over processes (on the training device)
    gather: Callable[[torch.Tensor], torch.Tensor]  # every process's tensor, concatenated in rank order (device)
    hand_over: Callable[[torch.Tensor, str], None]  # this process's direction → the mean over processes, refused
    #   when non-finite (`NonFiniteGradientError`, naming the label), else written where the optimizer steps from


@dataclass(frozen=True)
class BarrierResult:
    """This process's share of the batch update, ready for the cross-process mean."""

    direction: torch.Tensor  # loss gradient, FP32 (P,), before the mean over processes
    advantages: Advantages  # TRL's A_i and the barrier scalars used
    bucket_scales: dict[int, float]  # s_b
    dropped: tuple[int, ...]  # rows whose policy term TRL's off-policy mask dropped, sorted
    policy_terms: tuple[float, ...]  # per trajectory index: s_b·(free_i − A_i·g·V_i)
    loss: float  # the loss value TRL reports: Σ policy_terms + entropy bonus + router term
    kl: float  # Σ_i KL sums / max(loss tokens, 1) (TRL's `kl` metric when β ≠ 0)


def bucket_tokens(scored_tokens: tuple[int, ...], buckets: Mapping[int, int] | None) -> dict[int, int]:
    """Loss tokens of this process per bucket (`buckets`: row → bucket, None: one bucket 0)."""
    per_bucket: dict[int, int] = defaultdict(int)
    for index, n in enumerate(scored_tokens):
        per_bucket[buckets[index] if buckets else 0] += n
    return dict(per_bucket)


def grpo_barrier(totals: BatchTotals, advantages: Advantages, normalization: LossNormalization,
                 global_tokens: int, buckets: Mapping[int, int] | None, rule: PolicyValueRule = PolicyValueRule(),
                 entropy: EntropyNormalizers | None = None) -> BarrierResult:
    """The barrier (module docstring). `global_tokens`: loss tokens of every process (after the reduction).
    Off-policy masked rows that waited for the batch mean are folded into `totals.accumulator` here."""
    scales = normalization.bucket_scales(bucket_tokens(totals.scored_tokens, buckets), global_tokens)
    dropped = list(totals.off_policy_dropped)
    for index, bucket, vector in totals.deferred:  # off-policy masked rows whose sign needed the batch mean
        if advantages.values[index] < 0:
            dropped.append(index)
        else:
            totals.accumulator.add_final(vector, advantages.values[index], bucket)
    direction = totals.accumulator.direction(scales, advantages.policy_scale, advantages.policy_offset)
    if totals.router_aux is not None:  # coef·aux_b/GA per micro-batch: already final, no barrier scalar
        direction.add_(totals.router_aux.direction)
    if entropy is not None:  # −coef·Σ_{i∈b} ∇Σ_t m H / (max(N_b, 1)·GA), before DDP's average
        for b, vector in totals.entropy_terms.items():
            direction.add_(vector, alpha=entropy.scales[b])
    terms = policy_loss_terms(totals, advantages.values, scales, buckets, normalization, dropped, rule)
    loss = sum(terms)
    if entropy is not None:
        loss += entropy.value(totals.entropy_sums)
    if totals.router_aux is not None:
        loss += totals.router_aux.loss
    kl = sum(totals.kl_sums) / max(sum(totals.scored_tokens), 1)
    return BarrierResult(direction, advantages, scales, tuple(sorted(dropped)), tuple(terms), loss, kl)


def close_grpo_batch(totals: BatchTotals, normalization: LossNormalization, buckets: Mapping[int, int] | None,
                     num_generations: int, collectives: Collectives, label: str,
                     rule: PolicyValueRule = PolicyValueRule(),
                     entropy: EntropyNormalizers | None = None) -> BarrierResult:
    """The whole barrier of one process: the global loss-token count (`collectives.sum`), the advantages with the
    batch statistics of every process's rewards (`collectives.gather`, `advantages.py`), `grpo_barrier`, and the
    direction handed over (`collectives.hand_over`, `label` naming the step in its refusal)."""
    global_tokens = collectives.sum(torch.tensor(sum(totals.scored_tokens))).item()
    local = statistics_rewards(totals)
    gathered = None if local is None else collectives.gather(local).cpu()
    advantages = batch_advantages(totals, gathered, num_generations)
    result = grpo_barrier(totals, advantages, normalization, global_tokens, buckets, rule, entropy)
    collectives.hand_over(result.direction, label)
    return result


def policy_loss_terms(totals: BatchTotals, advantages: tuple[float, ...], scales: dict[int, float],
                      buckets: Mapping[int, int] | None, normalization: LossNormalization, dropped,
                      rule: PolicyValueRule = PolicyValueRule()) -> list[float]:
    """The loss value TRL reports, per trajectory: s_b·(free_i − A_i·g(A_i)·V_i) (ratio ≡ 1).

    V_i = Σ_t m_it u_i c_it h_it (times cispo's min(1, ε_high)) comes with the trajectory's backward
    (`streaming/source.py`); g = 2/τ_± for sapo (TRL's 4σ(0)/τ, τ by the sign of A_i), else 1. A row the
    off-policy mask dropped has no policy value (TRL multiplies its policy loss by 0)."""
    dropped = set(dropped)
    terms = []
    for index, n in enumerate(totals.scored_tokens):
        value = totals.policy_values[index] if index < len(totals.policy_values) else None
        if value is None:  # a backward that reports none: TRL's grpo-like value Σ_t m_it u_i
            value = n * normalization.sequence_weight(n)
        advantage = advantages[index]
        if normalization.kind.value_gate == "sapo":
            positive, negative = rule.sapo_temperatures
            value *= 2.0 / (positive if advantage > 0 else negative)
        if index in dropped:
            value = 0.0
        scale = scales[buckets[index] if buckets else 0]
        terms.append(scale * (totals.free_values[index] - advantage * value))
    return terms
