"""Exact GRPO gradient streaming through group sufficient statistics (paper §3.4, Eq. 4–7).

For trajectory i with reward R_i and per-trajectory score gradient H_i (shape `(P,)`, FP32, P = trainable
parameters), the group's policy-gradient contribution is

    Σ_i A_i H_i,   A_i = (R_i − μ_g) / s,        s = σ_g + eps (group), σ_batch + eps (batch) or 1 (none)
                 = (G1 − (μ_g − c) · G2) / s,   G1 = Σ_i (R_i − c) H_i,  G2 = Σ_i H_i

where c is a shift fixed when the group's first scorable member arrives (its reward). The shift is an exact
identity that keeps G1 small when rewards share a large offset, so FP32 cancellation in `G1 − μ G2` stays at the
level of the reward spread rather than the reward magnitude. Unscorable members (reward NaN) get A = 0 and are left
out of G1, G2, μ and σ, exactly as TRL's nan-aware statistics do.

Statistics are kept per *bucket*: trajectories whose loss normalizer is the same barrier-time scalar (all of them,
except for `bnpo` with several micro-batches, where TRL normalizes each micro-batch by its own token count).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


def nanstd_bessel(values: list[float]) -> float:
    """TRL's `nanstd`: Bessel-corrected standard deviation over the non-NaN values; NaN when fewer than two."""
    finite = torch.tensor([v for v in values if not math.isnan(v)], dtype=torch.float32)
    if finite.numel() < 2:
        return float("nan")
    mean = finite.mean()
    variance = ((finite - mean) ** 2).mean() * finite.numel() / (finite.numel() - 1)
    return float(torch.sqrt(variance))


def nanmean(values: list[float]) -> float:
    finite = torch.tensor([v for v in values if not math.isnan(v)], dtype=torch.float32)
    return float(finite.mean()) if finite.numel() else float("nan")


@dataclass
class _BucketStats:
    g1: torch.Tensor  # Σ (R_i − c) H_i over scorable members in this bucket, FP32 (P,)
    g2: torch.Tensor  # Σ H_i over scorable members in this bucket, FP32 (P,)


@dataclass
class GroupStatistics:
    """Running statistics of one GRPO group; closed once all `size` members have been added."""

    group: int
    size: int
    num_params: int
    rewards: list[float] = field(default_factory=list)  # in arrival order, NaN for unscorable members
    shift: float | None = None  # c: the first scorable reward
    buckets: dict[int, _BucketStats] = field(default_factory=dict)
    folded: bool = False  # `fold` consumed G1 and G2 in place

    @property
    def complete(self) -> bool:
        return len(self.rewards) == self.size

    @property
    def scorable(self) -> bool:
        return any(not math.isnan(r) for r in self.rewards)

    def add(self, reward: float, score_grad: torch.Tensor | None, bucket: int = 0) -> None:
        """Fold one member. `score_grad` is H_i; None means H_i = 0 (no scored tokens, or an unscorable member).

        A member without scored tokens still enters μ and σ, as in TRL, where its advantage is computed but
        multiplied by an all-zero mask.
        """
        if self.complete:
            raise ValueError(f"group {self.group} already has its {self.size} members")
        self.rewards.append(reward)
        if math.isnan(reward):
            return
        if self.shift is None:
            self.shift = reward
        if score_grad is None:
            return
        stats = self.buckets.get(bucket)
        if stats is None:
            zeros = torch.zeros(self.num_params, dtype=torch.float32, device=score_grad.device)
            stats = self.buckets[bucket] = _BucketStats(zeros, zeros.clone())
        stats.g1.add_(score_grad, alpha=reward - self.shift)
        stats.g2.add_(score_grad)

    @property
    def mean(self) -> float:
        return nanmean(self.rewards)

    @property
    def std(self) -> float:
        return nanstd_bessel(self.rewards)

    def fold(self, scale: float) -> dict[int, torch.Tensor]:
        """Σ_i A_i H_i per bucket with A_i = (R_i − μ)·scale; `scale` is 1/(σ+eps), or 1 for scale_rewards=none.

        A non-finite scale (a group with a single scorable member has σ = NaN under Bessel's correction, as in
        TRL, whose advantages then become NaN and are zeroed) contributes nothing.

        The fold consumes G1 and G2: it computes (G1 − offset·G2)·scale in their own buffers (the same FP32
        operations in the same order as out of place, so the same bits), because at the sizes users train two
        parameter-sized temporaries at every group close were the run's peak (issue 40). A second fold raises.
        """
        if not self.complete:
            raise ValueError(f"group {self.group} folded with {len(self.rewards)}/{self.size} members")
        if self.folded:
            raise ValueError(f"group {self.group} was folded already (the fold consumes its statistics)")
        self.folded = True
        if not math.isfinite(scale) or self.shift is None:
            return {}
        offset = self.mean - self.shift
        out = {}
        for bucket, stats in self.buckets.items():
            stats.g2.mul_(offset)
            out[bucket] = stats.g1.sub_(stats.g2).mul_(scale)
        return out

    def free(self) -> None:
        self.buckets.clear()

    def nbytes(self) -> int:
        return sum(s.g1.numel() * 4 * 2 for s in self.buckets.values())


class BatchAccumulator:
    """Sum of barrier-ready directions per bucket: folded policy terms and advantage-free terms (β·KL)."""

    def __init__(self, num_params: int, device: torch.device | str = "cpu") -> None:
        self.num_params = num_params
        self.device = torch.device(device)
        self.policy: dict[int, torch.Tensor] = {}  # Σ_groups Σ_i A_i H_i (before a batch-level σ)
        self.free_terms: dict[int, torch.Tensor] = {}  # Σ_i K_i, terms that do not depend on advantages
        self.offset_terms: dict[int, torch.Tensor] = {}  # normalize_then_sum: Q = Σ_i H_i (scorable rows)
        self.final_policy: dict[int, torch.Tensor] = {}  # Σ_i A_i H_i with A_i final (no barrier scalar left)

    def _buffer(self, store: dict[int, torch.Tensor], bucket: int) -> torch.Tensor:
        if bucket not in store:
            store[bucket] = torch.zeros(self.num_params, dtype=torch.float32, device=self.device)
        return store[bucket]

    def _take(self, store: dict[int, torch.Tensor], bucket: int, vector: torch.Tensor) -> None:
        """Add `vector` into the bucket's sum. The first vector of a bucket is adopted, not copied into zeros: every
        caller hands over a vector it no longer uses (a group's consumed fold, a pass's fresh gradient), and one
        parameter-sized allocation less at the sizes users train is what decided the run's peak (issue 40)."""
        if bucket in store:
            store[bucket].add_(vector)
        elif (vector.dtype == torch.float32 and vector.device == self.device and vector.is_contiguous()
              and vector.untyped_storage().nbytes() == 4 * self.num_params == 4 * vector.numel()):  # owns its memory
            store[bucket] = vector
        else:
            self._buffer(store, bucket).add_(vector)

    def add_policy(self, per_bucket: dict[int, torch.Tensor]) -> None:
        for bucket, vector in per_bucket.items():
            self._take(self.policy, bucket, vector)

    def add_free(self, vector: torch.Tensor, bucket: int = 0) -> None:
        self._take(self.free_terms, bucket, vector)

    def add_offset(self, per_bucket: dict[int, torch.Tensor]) -> None:
        """normalize_then_sum: Σ H_i of scorable rows, multiplied by −μ_B at the barrier (`objectives.py`)."""
        for bucket, vector in per_bucket.items():
            self._take(self.offset_terms, bucket, vector)

    def add_final(self, vector: torch.Tensor, advantage: float, bucket: int = 0) -> None:
        """A_i H_i of one trajectory whose advantage is already final (off-policy masking decided at the barrier)."""
        self._buffer(self.final_policy, bucket).add_(vector, alpha=advantage)

    def direction(self, bucket_scale: dict[int, float], policy_scale: float = 1.0,
                  policy_offset: float = 0.0) -> torch.Tensor:
        """Loss gradient: Σ_b scale_b · (−policy_scale · (P_b − policy_offset · Q_b) − F_b + K_b). The minus sign:
        the loss is −A·log π. Q_b (normalize_then_sum) and F_b (final advantages) are empty otherwise."""
        out = torch.zeros(self.num_params, dtype=torch.float32, device=self.device)
        for bucket in set(self.policy) | set(self.free_terms) | set(self.offset_terms) | set(self.final_policy):
            scale = bucket_scale[bucket]
            if bucket in self.policy:
                out.add_(self.policy[bucket], alpha=-policy_scale * scale)
            if bucket in self.offset_terms and policy_offset != 0.0 and policy_scale != 0.0:
                out.add_(self.offset_terms[bucket], alpha=policy_scale * policy_offset * scale)
            if bucket in self.final_policy:
                out.add_(self.final_policy[bucket], alpha=-scale)
            if bucket in self.free_terms:
                out.add_(self.free_terms[bucket], alpha=scale)
        return out

    def nbytes(self) -> int:
        stores = [self.policy, self.free_terms, self.offset_terms, self.final_policy]
        return sum(v.numel() * 4 for store in stores for v in store.values())


def stats_memory_bytes(num_params: int, max_open_groups: int) -> int:
    """The memory bound of the streamed statistics: 4·(2k+1)·P bytes (k open groups, one batch buffer)."""
    return 4 * (2 * max_open_groups + 1) * num_params
