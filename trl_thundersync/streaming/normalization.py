"""TRL 1.16's GRPO loss normalizers, split into what is known per trajectory and what only at the barrier.

With one iteration per generation batch the importance ratio is exactly 1 at θ_k, so for every supported
`loss_type` (one entry each in `streaming/loss_types.py`, which this module reads) the per-token loss gradient is
`ν_it · (−c·A_i ∇log π(o_it) + β ∇[KL_it · ratio_it])` with `ν_it = u_i · s_b`: `u_i` is fixed when trajectory i
is scored, `s_b` is fixed when the batch closes.

| loss_type            | u_i (per trajectory)  | s_b (barrier scalar, bucket b)                              |
|----------------------|-----------------------|-------------------------------------------------------------|
| grpo, sapo           | 1 / max(|m_i|, 1)     | 1 / B                                                       |
| bnpo                 | 1                     | 1 / (max(N_b, 1) · GA)  (N_b: loss tokens of micro-batch b) |
| dr_grpo              | 1                     | 1 / (B · max_completion_length)                             |
| dapo, cispo, vespo   | 1                     | W / max(N, 1)   (N: loss tokens of the global batch)        |
| luspo                | 1                     | 1 / B                                                       |

B is the number of trajectories in the local generation batch, GA = steps_per_generation micro-batches and W the
number of processes; each process computes its local direction this way and the barrier averages them over W,
exactly as TRL's per-rank losses followed by DDP's gradient averaging do.
`c` is 1 except for cispo, where TRL's detached clamp gives `min(1, ε_high)`, with ε_high = `epsilon_high`, or
`epsilon` when that is None (TRL's trainer falls back the same way). sapo's soft gate and vespo's
gamma weight both have value 1 and unit slope at ratio 1, so they reduce to the same gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

from .loss_types import LossType, loss_type


@dataclass(frozen=True)
class LossNormalization:
    """Normalization rule of one loss type for one generation batch shape (built from a config by
    `trainers/grpo/settings.loss_normalization`)."""

    loss_type: str
    batch_size: int  # B: trajectories in the local generation batch
    micro_batches: int  # steps_per_generation: micro-batches the generation batch is split into
    max_completion_length: int
    policy_coefficient: float = 1.0  # c in the table above
    num_processes: int = 1  # W

    def __post_init__(self) -> None:
        loss_type(self.loss_type)  # an unknown name is refused here, not at the barrier

    @property
    def kind(self) -> LossType:
        """The loss type's table entry (`streaming/loss_types.py`)."""
        return loss_type(self.loss_type)

    @property
    def uses_buckets(self) -> bool:
        """Whether micro-batch membership changes the gradient (bnpo with several micro-batches)."""
        return self.kind.bucket_scale == "micro_batch_tokens" and self.micro_batches > 1

    def sequence_weight(self, scored_tokens: int) -> float:
        """u_i: the per-trajectory factor known as soon as its loss mask is fixed."""
        if self.kind.sequence_mean:
            return 1.0 / max(scored_tokens, 1)
        return 1.0

    def bucket_scales(self, tokens_per_bucket: dict[int, int], global_tokens: int) -> dict[int, float]:
        """s_b for every bucket, from token counts that are final only at the barrier.

        `tokens_per_bucket` counts this process's loss tokens per micro-batch; `global_tokens` all processes'.
        """
        b, rule = self.batch_size, self.kind.bucket_scale
        if rule == "sequences":
            return {k: 1.0 / b for k in tokens_per_bucket}
        if rule == "completion_budget":
            return {k: 1.0 / (b * self.max_completion_length) for k in tokens_per_bucket}
        if rule == "micro_batch_tokens":
            ga = self.micro_batches
            if not self.uses_buckets:
                return {k: 1.0 / max(sum(tokens_per_bucket.values()), 1) for k in tokens_per_bucket}
            return {k: 1.0 / (max(n, 1) * ga) for k, n in tokens_per_bucket.items()}
        return {k: self.num_processes / max(global_tokens, 1) for k in tokens_per_bucket}  # "global_tokens"


def entropy_scales(tokens_per_micro_batch: dict[int, int], micro_batches: int) -> dict[int, float]:
    """TRL's entropy-bonus normalizer of micro-batch b, for every loss type: 1 / (max(N_b, 1) · GA).

    TRL subtracts `coef · Σ_t m H / max(N_b, 1) / GA` in every micro-batch (a token mean over the micro-batch, never
    a loss-type normalizer), so the bonus needs the micro-batch partition even where the policy term does not.
    """
    return {b: 1.0 / (max(n, 1) * micro_batches) for b, n in tokens_per_micro_batch.items()}


def micro_batch_of(permutation: list[int], micro_batches: int) -> dict[int, int]:
    """Row → micro-batch index under TRL's shuffle-then-split (`shuffle_sequence_dict`, `split_tensor_dict`)."""
    size = len(permutation) // micro_batches
    return {row: position // size for position, row in enumerate(permutation)}
