"""TRL 1.16's GRPO advantages at the barrier, and the one place that decides what `scale_rewards` means.

sum_then_normalize (TRL's default), with μ_g, σ_g the group's nanmean and Bessel nanstd:

    A_i = (R_i − μ_g) / s,   s = σ_g + eps ("group"), σ_B + eps ("batch": σ over every process's rewards), 1 ("none")

The learner folds each group as it closes with `RewardScaling.group_scale` (1/(σ_g + eps) for "group", else 1); the
barrier multiplies the folded batch sum by `Advantages.policy_scale` (1/(σ_B + eps) for "batch", else 1). Both read
the same `RewardScaling` (carried by `BatchTotals.scaling`), so the rule is decided once, here.

normalize_then_sum (`objectives.py`): A_i = (R_i − μ_B)/(σ_B + eps) over the group-normalized R_i of the whole batch
(`scale_rewards` plays no part); the barrier applies 1/(σ_B + eps) and the offset μ_B.

`frac_reward_zero_std` is TRL's: the fraction of rows whose σ (group σ_g for "group"/"none", σ_B otherwise) is close
to 0 by `torch.isclose`; a NaN σ (a group with fewer than two scorable members) does not count as zero.
Everything here is pure: the batch statistics are computed from rewards already gathered from every process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from trl.trainer.utils import nanstd

if TYPE_CHECKING:
    from .learner_records import BatchTotals

SCALE_REWARDS = ("group", "batch", "none")
EPS = 1e-4  # TRL's advantage epsilon


@dataclass(frozen=True)
class RewardScaling:
    """TRL's `scale_rewards` (sum_then_normalize): where σ divides the advantage."""

    mode: str  # "group": 1/(σ_g + eps) at each group's fold; "batch": 1/(σ_B + eps) at the barrier; "none": no σ
    eps: float = EPS  # added to σ before dividing

    def __post_init__(self) -> None:
        if self.mode not in SCALE_REWARDS:
            raise ValueError(f"scale_rewards={self.mode!r} is not one of {SCALE_REWARDS}")

    def group_scale(self, group_std: float) -> float:
        """The factor a closing group's Σ (R_i − μ_g) H_i is folded with (NaN for a σ_g of NaN: see `fold`)."""
        return 1.0 / (group_std + self.eps) if self.mode == "group" else 1.0

    @property
    def uses_batch_sigma(self) -> bool:
        """Whether the barrier needs σ over the whole batch (the rewards of every process)."""
        return self.mode == "batch"


@dataclass(frozen=True)
class Advantages:
    """TRL's advantages of this process's rows and the barrier scalars of the streamed direction."""

    values: tuple[float, ...]  # A_i per trajectory index of this process (NaN → 0, as TRL)
    policy_scale: float  # multiplies the folded Σ A H: 1/(σ_B + eps) ("batch", normalize_then_sum), else 1
    policy_offset: float  # normalize_then_sum: μ_B (times Q = Σ H at the barrier); 0 otherwise
    zero_std_fraction: float  # TRL's `frac_reward_zero_std`


def statistics_rewards(totals: BatchTotals) -> torch.Tensor | None:
    """This process's values whose batch statistics the barrier needs (to be gathered from every process): the
    group-normalized R_i under normalize_then_sum, the rewards under scale_rewards="batch"; None when none are."""
    if totals.objective_rewards is not None:
        return torch.tensor(totals.objective_rewards, dtype=torch.float32)
    if totals.scaling.uses_batch_sigma:
        return torch.tensor(totals.rewards, dtype=torch.float32)
    return None


def batch_advantages(totals: BatchTotals, gathered: torch.Tensor | None, num_generations: int) -> Advantages:
    """The advantages of one batch; `gathered` is `statistics_rewards` of every process, concatenated (CPU)."""
    if totals.objective_rewards is not None:
        return objective_advantages(totals.objective_rewards, gathered)
    return group_advantages(totals, gathered, num_generations)


def group_advantages(totals: BatchTotals, gathered: torch.Tensor | None, num_generations: int) -> Advantages:
    """sum_then_normalize: A_i = (R_i − μ_g)/s (module docstring), computed as TRL computes it."""
    scaling, g = totals.scaling, num_generations
    rewards = torch.tensor(totals.rewards, dtype=torch.float32)
    means = torch.tensor(totals.group_means, dtype=torch.float32).repeat_interleave(g)
    if scaling.uses_batch_sigma:
        if gathered is None:
            raise ValueError("scale_rewards='batch' needs the rewards of every process (statistics_rewards)")
        sigma = float(nanstd(gathered)) if gathered.numel() > 1 else 0.0
        policy_scale = 1.0 / (sigma + scaling.eps)
        std = torch.full_like(rewards, sigma)
    else:
        policy_scale = 1.0
        std = torch.tensor(totals.group_stds, dtype=torch.float32).repeat_interleave(g)
    adv = rewards - means
    if scaling.mode != "none":
        adv = adv / (std + scaling.eps)
    zero_std = float(torch.isclose(std, torch.zeros_like(std)).float().mean())
    if not math.isfinite(policy_scale):
        policy_scale = 0.0
    return Advantages(tuple(torch.nan_to_num(adv, nan=0.0).tolist()), policy_scale, 0.0, zero_std)


def objective_advantages(objective_rewards: tuple[float, ...], gathered: torch.Tensor | None) -> Advantages:
    """normalize_then_sum: A_i = (R_i − μ_B)/(σ_B + eps) over the whole (gathered) batch of group-normalized R_i."""
    if gathered is None:
        raise ValueError("normalize_then_sum needs the group-normalized rewards of every process (statistics_rewards)")
    rewards = torch.tensor(objective_rewards, dtype=torch.float32)
    sigma = nanstd(gathered) if gathered.numel() > 1 else torch.zeros(())
    mean = torch.nanmean(gathered)
    adv = (rewards - mean) / (sigma + EPS)
    zero_std = float(torch.isclose(sigma, torch.zeros_like(sigma)).float())
    policy_scale, offset = 1.0 / (float(sigma) + EPS), float(mean)
    if not (math.isfinite(policy_scale) and math.isfinite(offset)):
        policy_scale, offset = 0.0, 0.0
    return Advantages(tuple(torch.nan_to_num(adv, nan=0.0).tolist()), policy_scale, offset, zero_std)
