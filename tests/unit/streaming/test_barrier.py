"""The GRPO barrier's math (`streaming/advantages.py`, `streaming/barrier.py`) on hand-written totals, against a
direct computation of TRL's advantages, normalizers and loss value."""

from __future__ import annotations

import math

import pytest
import torch
from trl.trainer.utils import nanstd

from trl_thundersync.streaming.accumulators import BatchAccumulator
from trl_thundersync.streaming.advantages import (
    RewardScaling,
    batch_advantages,
    objective_advantages,
    statistics_rewards,
)
from trl_thundersync.streaming.barrier import (
    Collectives,
    EntropyNormalizers,
    PolicyValueRule,
    bucket_tokens,
    close_grpo_batch,
    grpo_barrier,
    policy_loss_terms,
)
from trl_thundersync.streaming.batch_metrics import reward_metrics, stats_bound_bytes
from trl_thundersync.streaming.learner_records import BatchTotals
from trl_thundersync.streaming.normalization import LossNormalization

G, P = 2, 5


def group_moments(rewards):
    r = torch.tensor(rewards, dtype=torch.float32).view(-1, G)
    return torch.nanmean(r, dim=1).tolist(), nanstd(r, dim=1).tolist()


def totals_for(rewards, H, K, tokens, scale, values=None, **extra):
    """BatchTotals as the learner leaves them for one bucket: P = Σ_i (R_i − μ_g)·f_g·H_i over scorable rows (f_g the
    group fold's factor), F = Σ_i K_i."""
    scaling = RewardScaling(scale)
    means, stds = group_moments(rewards)
    acc = BatchAccumulator(P)
    for i, r in enumerate(rewards):
        if not math.isnan(r):
            g = i // G
            factor = scaling.group_scale(stds[g])
            if math.isfinite(factor):
                acc.add_policy({0: H[i] * ((r - means[g]) * factor)})
        acc.add_free(K[i])
    n = len(rewards)
    return BatchTotals(accumulator=acc, rewards=tuple(rewards), group_means=tuple(means), group_stds=tuple(stds),
                       scored_tokens=tuple(tokens), free_values=tuple(0.1 * (i + 1) for i in range(n)),
                       kl_sums=tuple(0.5 for _ in range(n)), work=(), peak_stats_bytes=0, scaling=scaling,
                       policy_values=tuple(values) if values is not None else (), **extra)


def close(a, b):
    return torch.allclose(a, b, rtol=1e-5, atol=1e-6 * float(b.abs().max()))


def test_batch_sigma_over_every_process_and_the_global_token_count_set_the_direction():
    """scale_rewards='batch' with dapo on 2 processes: A_i = (R_i − μ_g)/(σ_B + 1e-4) with σ_B over both processes'
    rewards, s = W/N with N the loss tokens of both processes; d = s·(−Σ A_i H_i + Σ K_i)."""
    torch.manual_seed(0)
    rewards, other = [1.0, 0.0, 2.0, 5.0], torch.tensor([3.0, -1.0, 0.5, 0.5])
    H, K = torch.randn(4, P), torch.randn(4, P)
    tokens, other_tokens = [3, 1, 2, 4], 6
    totals = totals_for(rewards, H, K, tokens, "batch", values=[1.0, 2.0, 3.0, 4.0])
    local = statistics_rewards(totals)
    gathered = torch.cat([local, other])
    normalization = LossNormalization("dapo", 4, 1, 16, num_processes=2)

    sigma_b = float(nanstd(gathered))
    means = torch.tensor(group_moments(rewards)[0]).repeat_interleave(G)
    adv = (torch.tensor(rewards) - means) / (sigma_b + 1e-4)
    s = 2 / (sum(tokens) + other_tokens)
    expected = s * (-(adv.unsqueeze(1) * H).sum(0) + K.sum(0))

    advantages = batch_advantages(totals, gathered, G)
    result = grpo_barrier(totals, advantages, normalization, sum(tokens) + other_tokens, None)
    assert torch.allclose(torch.tensor(advantages.values), adv)
    assert advantages.policy_scale == pytest.approx(1 / (sigma_b + 1e-4))
    assert close(result.direction, expected)
    # TRL's loss value at ratio 1: Σ_i s·(free_i − A_i·V_i)
    loss = sum(s * (0.1 * (i + 1) - float(adv[i]) * (i + 1)) for i in range(4))
    assert result.loss == pytest.approx(loss, rel=1e-6)
    assert result.kl == pytest.approx(2.0 / 10)

    # the checks above fail for a σ over this process only, or for this process's token count
    local_only = batch_advantages(totals, local, G)
    assert not close(grpo_barrier(totals, local_only, normalization, 16, None).direction, expected)
    assert not close(grpo_barrier(totals, advantages, normalization, sum(tokens), None).direction, expected)


def test_one_core_call_runs_the_collectives_and_hands_the_direction_over():
    """`close_grpo_batch` with a fake second process (its rewards and loss tokens): the token sum and the gather go
    through the collectives object, and the direction handed over is `grpo_barrier`'s on the gathered values."""
    torch.manual_seed(0)
    rewards, other = [1.0, 0.0, 2.0, 5.0], torch.tensor([3.0, -1.0, 0.5, 0.5])
    H, K = torch.randn(4, P), torch.randn(4, P)
    tokens, other_tokens = [3, 1, 2, 4], 6
    totals = totals_for(rewards, H, K, tokens, "batch", values=[1.0, 2.0, 3.0, 4.0])
    normalization = LossNormalization("dapo", 4, 1, 16, num_processes=2)
    handed = []
    collectives = Collectives(sum=lambda t: t + other_tokens, gather=lambda t: torch.cat([t, other]),
                              hand_over=lambda direction, label: handed.append((direction, label)))
    result = close_grpo_batch(totals, normalization, None, G, collectives, "optimizer step 3")
    advantages = batch_advantages(totals, torch.cat([statistics_rewards(totals), other]), G)
    expected = grpo_barrier(totals, advantages, normalization, sum(tokens) + other_tokens, None)
    assert result.advantages == advantages
    assert torch.equal(result.direction, expected.direction) and result.loss == expected.loss
    assert len(handed) == 1 and handed[0][0] is result.direction and handed[0][1] == "optimizer step 3"


def test_group_scaling_advantages_and_zero_std_fraction_follow_trl():
    """A zero-spread group counts as zero σ; a group with one scorable member (σ NaN) does not, and its rows get
    A = 0 (TRL's isclose and nan_to_num)."""
    rewards = [1.0, 3.0, 2.0, 2.0, math.nan, 4.0]
    H, K = torch.randn(6, P), torch.zeros(6, P)
    for scale in ("group", "none"):
        totals = totals_for(rewards, H, K, [1] * 6, scale)
        assert statistics_rewards(totals) is None  # no batch statistics, no gather
        got = batch_advantages(totals, None, G)
        r = torch.tensor(rewards).view(-1, G)
        mean, std = torch.nanmean(r, dim=1, keepdim=True), nanstd(r, dim=1, keepdim=True)
        adv = (r - mean) if scale == "none" else (r - mean) / (std + 1e-4)
        assert got.values == tuple(torch.nan_to_num(adv, nan=0.0).view(-1).tolist())
        assert got.policy_scale == 1.0 and got.policy_offset == 0.0
        assert got.zero_std_fraction == pytest.approx(2 / 6)
        expected = -(torch.nan_to_num(adv, nan=0.0).view(-1, 1) * H).sum(0) / 6  # grpo: s = 1/B
        result = grpo_barrier(totals, got, LossNormalization("grpo", 6, 1, 16), 6, None)
        assert close(result.direction, expected)


def test_reward_scaling_is_decided_once():
    assert RewardScaling("group").group_scale(1.0) == 1 / (1.0 + 1e-4)
    assert RewardScaling("batch").group_scale(1.0) == RewardScaling("none").group_scale(1.0) == 1.0
    assert RewardScaling("batch").uses_batch_sigma and not RewardScaling("group").uses_batch_sigma
    with pytest.raises(ValueError, match="scale_rewards"):
        RewardScaling("groups")
    totals = totals_for([1.0, 0.0], torch.zeros(2, P), torch.zeros(2, P), [1, 1], "batch")
    with pytest.raises(ValueError, match="every process"):
        batch_advantages(totals, None, G)


def test_normalize_then_sum_barrier_applies_the_batch_mean_and_decides_deferred_rows():
    """A_i = (R_i − μ_B)/(σ_B + 1e-4); d = −(Σ R H − μ_B Q)/(σ_B + eps)·s − Σ_{deferred, A ≥ 0} A_i H_i·s."""
    torch.manual_seed(1)
    normalized = [0.5, -0.5, 1.5, -1.5]
    H = torch.randn(4, P)
    acc = BatchAccumulator(P)
    acc.add_policy({0: sum(normalized[i] * H[i] for i in (0, 1))})  # rows 2 and 3 were off-policy masked
    acc.add_offset({0: H[0] + H[1]})
    totals = BatchTotals(accumulator=acc, rewards=(1.0, 0.0, 2.0, 0.0), group_means=(0.5, 1.0),
                         group_stds=(0.7, 1.4), scored_tokens=(2, 2, 2, 2), free_values=(0.0,) * 4,
                         kl_sums=(0.0,) * 4, work=(), peak_stats_bytes=0, scaling=RewardScaling("group"),
                         objective_rewards=tuple(normalized), deferred=((2, 0, H[2]), (3, 0, H[3])))
    gathered = statistics_rewards(totals)
    r = torch.tensor(normalized)
    sigma, mean = nanstd(r), torch.nanmean(r)
    adv = (r - mean) / (sigma + 1e-4)
    advantages = batch_advantages(totals, gathered, G)
    assert advantages == objective_advantages(tuple(normalized), gathered)
    assert advantages.policy_offset == pytest.approx(float(mean), abs=1e-7)
    result = grpo_barrier(totals, advantages, LossNormalization("grpo", 4, 1, 16), 8, None)
    assert result.dropped == (3,)  # A_3 < 0: TRL's mask drops its policy term; A_2 ≥ 0 folds
    kept = [0, 1, 2]
    expected = -(adv[kept].unsqueeze(1) * H[kept]).sum(0) / 4
    assert close(result.direction, expected)
    assert result.policy_terms[3] == 0.0  # a dropped row has no policy value


def test_bnpo_buckets_normalize_each_micro_batch_by_its_own_tokens():
    buckets = {0: 0, 1: 1, 2: 1, 3: 0}
    assert bucket_tokens((3, 1, 2, 4), buckets) == {0: 7, 1: 3}
    assert bucket_tokens((3, 1, 2, 4), None) == {0: 10}
    torch.manual_seed(2)
    H = torch.randn(4, P)
    acc = BatchAccumulator(P)
    acc.add_policy({0: H[0] + H[3], 1: H[1] + H[2]})
    totals = BatchTotals(accumulator=acc, rewards=(1.0,) * 4, group_means=(0.0, 0.0), group_stds=(1.0, 1.0),
                         scored_tokens=(3, 1, 2, 4), free_values=(0.0,) * 4, kl_sums=(0.0,) * 4, work=(),
                         peak_stats_bytes=0, scaling=RewardScaling("none"))
    advantages = batch_advantages(totals, None, G)
    result = grpo_barrier(totals, advantages, LossNormalization("bnpo", 4, 2, 16), 10, buckets)
    assert result.bucket_scales == {0: 1 / (7 * 2), 1: 1 / (3 * 2)}
    assert close(result.direction, -(H[0] + H[3]) / 14 - (H[1] + H[2]) / 6)


def test_sapo_loss_value_uses_the_temperature_of_the_advantage_sign():
    totals = totals_for([1.0, 0.0], torch.zeros(2, P), torch.zeros(2, P), [2, 2], "none", values=[1.0, 1.0])
    rule = PolicyValueRule(sapo_temperatures=(2.0, 4.0))
    terms = policy_loss_terms(totals, (0.5, -0.5), {0: 1.0}, None, LossNormalization("sapo", 2, 1, 16), (), rule)
    assert terms == pytest.approx([0.1 - 0.5 * 2 / 2.0, 0.2 + 0.5 * 2 / 4.0])


def test_entropy_bonus_value_and_direction_use_each_micro_batch_normalizer():
    torch.manual_seed(3)
    E = {0: torch.randn(P), 1: torch.randn(P)}
    bonus = EntropyNormalizers(coef=0.5, micro_batch={0: 0, 1: 1, 2: 1, 3: 0}, tokens={0: 4, 1: 2},
                               scales={0: 1 / 8, 1: 1 / 4})
    assert bonus.value((1.0, 2.0, 3.0, 4.0)) == pytest.approx(-0.5 * (5.0 / 4 + 5.0 / 2) / 2)
    totals = totals_for([1.0, 1.0, 1.0, 1.0], torch.zeros(4, P), torch.zeros(4, P), [2, 1, 1, 2], "group",
                        entropy_terms=E, entropy_sums=(1.0, 2.0, 3.0, 4.0))
    advantages = batch_advantages(totals, None, G)
    result = grpo_barrier(totals, advantages, LossNormalization("grpo", 4, 2, 16), 6, None, entropy=bonus)
    assert close(result.direction, E[0] / 8 + E[1] / 4)
    assert result.loss == pytest.approx(sum(result.policy_terms) + bonus.value(totals.entropy_sums))


def test_reward_metrics_and_stats_bound():
    per_func = torch.tensor([[1.0, math.nan], [3.0, 2.0], [math.nan, math.nan]])
    metrics = reward_metrics(per_func, ["a", "b"], [1.0, 5.0, math.nan])
    assert metrics["rewards/a/mean"] == 2.0 and math.isnan(metrics["rewards/b/std"])
    assert metrics["reward"] == 3.0 and metrics["reward_std"] == pytest.approx(float(nanstd(torch.tensor([1., 5.]))))
    totals = totals_for([1.0, 0.0, 2.0, 3.0], torch.zeros(4, P), torch.zeros(4, P), [1] * 4, "group")
    common = dict(batch_size=4, num_generations=2, max_open_groups=None, beta=0.0, max_buffered=None,
                  micro_batches=1, num_reward_functions=1, off_policy_mask=False)
    assert stats_bound_bytes(totals, release="reward", **common) == 4 * (2 * 2 + 1) * P
    assert stats_bound_bytes(totals, release="content", **common) == 4 * (2 * 2 + 1) * P + 4 * 4 * P
