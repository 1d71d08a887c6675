"""`multi_objective_aggregation="normalize_then_sum"`, streamed exactly through per-function group statistics.

TRL 1.16 normalizes each reward function k inside the group, sums with the weights, then normalizes over the batch:

    r̃_ik = (r_ik − μ_gk) / (σ_gk + 1e-4)            μ, σ: nanmean and Bessel nanstd of function k over group g
    R_i  = nansum_k w_k r̃_ik                          (NaN when every function returned None for row i)
    A_i  = (R_i − μ_B) / (σ_B + 1e-4)                 μ_B, σ_B: nanmean and nanstd of R over the whole batch

(`scale_rewards` plays no part). Per group, with c_k the first finite value of function k and the sums over the
members whose value r_ik is finite,

    Σ_i R_i H_i = Σ_k w_k / (σ_gk + 1e-4) · (G1_k − (μ_gk − c_k) G2_k),   G1_k = Σ (r_ik − c_k) H_i,  G2_k = Σ H_i

(a function with σ_gk = NaN — fewer than two finite values in the group — gives NaN r̃ that nansum skips, so it is
left out), and Q = Σ_{i scorable} H_i. Both fold into the batch accumulator when the group closes; at the barrier,
Σ_i A_i H_i = (Σ R_i H_i − μ_B Q) / (σ_B + 1e-4) over the batch (`BatchAccumulator.direction(offset=μ_B)`).
Memory: 2K+1 P-vectors per open group and bucket (K reward functions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from trl.trainer.utils import nanstd

EPS = 1e-4


def function_moments(rewards_per_func: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's μ_gk, σ_gk of one group (`rewards_per_func` (G, K)), each (1, 1, K), computed as TRL computes them."""
    grouped = rewards_per_func.unsqueeze(0)
    mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
    std_k = nanstd(grouped, dim=1, keepdim=True) if grouped.shape[1] > 1 else torch.zeros_like(mean_k)
    return mean_k, std_k


def group_normalized_rewards(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """TRL's R_i for one group: `rewards_per_func` is (G, K) (NaN where a function returned None); returns (G,)."""
    grouped = rewards_per_func.unsqueeze(0)
    mean_k, std_k = function_moments(rewards_per_func)
    reward_k = ((grouped - mean_k) / (std_k + EPS)).view(-1, grouped.shape[-1])
    rewards = (reward_k * weights.unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    return rewards


@dataclass
class _FunctionStats:
    g1: torch.Tensor  # Σ (r_ik − c_k) H_i over members with finite r_ik, FP32 (P,)
    g2: torch.Tensor  # Σ H_i over the same members


@dataclass
class ObjectiveGroupStatistics:
    """Running per-function statistics of one GRPO group under normalize_then_sum (the `GroupStatistics` role)."""

    group: int
    size: int
    num_params: int
    weights: tuple[float, ...]
    rewards: list[float] = field(default_factory=list)  # raw weighted rewards in arrival order (NaN: unscorable)
    members: dict[int, tuple[float, ...]] = field(default_factory=dict)  # batch index → rewards_per_func
    shifts: list[float | None] = field(default_factory=list)  # c_k
    buckets: dict[int, dict[int, _FunctionStats]] = field(default_factory=dict)  # bucket → k → stats
    scorable_sum: dict[int, torch.Tensor] = field(default_factory=dict)  # bucket → Q

    def __post_init__(self) -> None:
        self.shifts = [None] * len(self.weights)

    @property
    def complete(self) -> bool:
        return len(self.rewards) == self.size

    @property
    def scorable(self) -> bool:
        return any(not math.isnan(r) for r in self.rewards)

    def add(self, reward: float, score_grad: torch.Tensor | None, bucket: int = 0, *, index: int,
            rewards_per_func: tuple[float, ...]) -> None:
        """Fold one member: `score_grad` is H_i, None when it has no scored tokens, is unscorable or is held back
        (off-policy masking decides later); its per-function rewards enter μ_gk, σ_gk either way."""
        if self.complete:
            raise ValueError(f"group {self.group} already has its {self.size} members")
        if len(rewards_per_func) != len(self.weights):
            raise ValueError(f"{len(rewards_per_func)} rewards for {len(self.weights)} reward functions")
        self.rewards.append(reward)
        self.members[index] = tuple(rewards_per_func)
        for k, value in enumerate(rewards_per_func):
            if not math.isnan(value) and self.shifts[k] is None:
                self.shifts[k] = value
        if math.isnan(reward) or score_grad is None:
            return
        per_function = self.buckets.setdefault(bucket, {})
        for k, value in enumerate(rewards_per_func):
            if math.isnan(value):
                continue
            stats = per_function.get(k)
            if stats is None:
                zeros = torch.zeros(self.num_params, dtype=torch.float32, device=score_grad.device)
                stats = per_function[k] = _FunctionStats(zeros, zeros.clone())
            stats.g1.add_(score_grad, alpha=value - self.shifts[k])
            stats.g2.add_(score_grad)
        if bucket not in self.scorable_sum:
            self.scorable_sum[bucket] = torch.zeros(self.num_params, dtype=torch.float32, device=score_grad.device)
        self.scorable_sum[bucket].add_(score_grad)

    def _table(self) -> tuple[list[int], torch.Tensor]:
        order = sorted(self.members)  # TRL's row order
        return order, torch.tensor([self.members[i] for i in order], dtype=torch.float32).view(len(order), -1)

    def function_stats(self) -> tuple[list[float], list[float]]:
        """μ_gk and σ_gk (TRL's nanmean / nanstd over the group, in row order)."""
        mean, std = function_moments(self._table()[1])
        return mean.view(-1).tolist(), std.view(-1).tolist()

    def normalized(self) -> dict[int, float]:
        """R_i per batch index, exactly as TRL computes it (NaN for unscorable rows)."""
        order, table = self._table()
        values = group_normalized_rewards(table, torch.tensor(self.weights, dtype=torch.float32))
        return dict(zip(order, values.tolist(), strict=True))

    @property
    def mean(self) -> float:  # of R (for the barrier's records; the advantage uses the batch statistics)
        finite = [r for r in self.normalized().values() if not math.isnan(r)]
        return float(torch.tensor(finite).mean()) if finite else math.nan

    @property
    def std(self) -> float:
        return float(nanstd(torch.tensor(list(self.normalized().values()), dtype=torch.float32)))

    def fold(self) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """Per bucket: Σ_i R_i H_i and Q = Σ_{i scorable} H_i. Consumes the per-function statistics (in place)."""
        if not self.complete:
            raise ValueError(f"group {self.group} folded with {len(self.rewards)}/{self.size} members")
        means, stds = self.function_stats()
        weighted: dict[int, torch.Tensor] = {}
        for bucket, per_function in self.buckets.items():
            out = torch.zeros(self.num_params, dtype=torch.float32, device=self.scorable_sum[bucket].device)
            for k, stats in per_function.items():
                coefficient = self.weights[k] / (stds[k] + EPS)
                if not (math.isfinite(coefficient) and math.isfinite(means[k])):
                    continue  # TRL: r̃_ik = NaN for every member, skipped by nansum
                stats.g2.mul_(means[k] - self.shifts[k])  # in place, as GroupStatistics.fold: no temporaries
                out.add_(stats.g1.sub_(stats.g2), alpha=coefficient)
            weighted[bucket] = out
        return weighted, dict(self.scorable_sum)

    def free(self) -> None:
        self.buckets.clear()
        self.scorable_sum.clear()

    def nbytes(self) -> int:
        vectors = sum(2 * len(per_function) for per_function in self.buckets.values()) + len(self.scorable_sum)
        return vectors * self.num_params * 4


def objective_stats_bytes(num_params: int, max_open_groups: int, num_functions: int) -> int:
    """Memory bound of the normalize_then_sum statistics: 4·((2K+1)k + 2)·P bytes (k open groups, K functions; the
    batch buffers Σ R H and Q)."""
    return 4 * ((2 * num_functions + 1) * max_open_groups + 2) * num_params
