"""normalize_then_sum and the off-policy sequence mask, streamed: the learner's batch direction equals TRL's
Σ_i mask_i A_i H_i (TRL's own formulas, copied from grpo_trainer.py 1.16) for every arrival order and release point."""

from __future__ import annotations

import math
import random

import pytest
import torch
from trl.trainer.utils import nanstd

from trl_thundersync.streaming.importance import off_policy_kl
from trl_thundersync.streaming.learner import GRPOBatchLearner, SourceGradients
from trl_thundersync.streaming.objectives import ObjectiveGroupStatistics
from trl_thundersync.types import Rollout, ScoredRollout

G, P = 4, 40
NAN = math.nan
# 3 groups × 4 members × 3 functions: None values, a function with a single value in group 1, a zero-std group 2
REWARDS = [
    [1.0, 0.0, NAN], [0.5, NAN, 2.0], [2.0, 1.0, 1.0], [NAN, NAN, NAN],
    [3.0, NAN, 0.5], [1.0, 4.0, 0.0], [0.0, NAN, 1.5], [2.0, NAN, 0.5],
    [1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0],
]
WEIGHTS = (0.5, 2.0, 1.0)


def trl_normalize_then_sum(rewards_per_func, weights, num_generations=G):
    """TRL 1.16 `_generate_and_score_completions`, normalize_then_sum branch (advantages after nan_to_num)."""
    rewards_per_func = torch.tensor(rewards_per_func, dtype=torch.float32)
    weights = torch.tensor(weights, dtype=torch.float32)
    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.shape[1])
    mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
    std_k = nanstd(grouped, dim=1, keepdim=True)
    reward_k = ((grouped - mean_k) / (std_k + 1e-4)).view(-1, rewards_per_func.shape[1])
    rewards = (reward_k * weights.unsqueeze(0)).nansum(dim=1)
    rewards[unscorable_mask] = torch.nan
    std_rewards = nanstd(rewards).expand_as(rewards)
    advantages = (rewards - torch.nanmean(rewards)) / (std_rewards + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0), rewards


def trl_sum_then_normalize(rewards_per_func, weights, scale="group", num_generations=G):
    rewards_per_func = torch.tensor(rewards_per_func, dtype=torch.float32)
    rewards = (rewards_per_func * torch.tensor(weights).unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    mean = torch.nanmean(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations)
    if scale == "batch":
        std = nanstd(rewards).expand_as(rewards)
    else:
        std = nanstd(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations)
    adv = rewards - mean if scale == "none" else (rewards - mean) / (std + 1e-4)
    return torch.nan_to_num(adv, nan=0.0)


def trl_off_policy_keep(advantages, kls, threshold):
    """TRL's `get_off_policy_mask`: keep if A ≥ 0 or the sequence KL ≤ threshold."""
    return ((advantages >= 0) | (torch.tensor(kls) <= threshold)).float()


def weighted_sum(values, weights):
    finite = [w * v for v, w in zip(values, weights, strict=True) if not math.isnan(v)]
    return sum(finite) if finite else NAN


def run_learner(order, H, *, objective=True, scale="group", kls=None, threshold=None, release="reward",
                rewards=REWARDS):
    n = len(rewards)
    kls = kls or [0.0] * n

    def backward(index):
        return SourceGradients(H[index], None, 5, off_policy_kl=kls[index])

    learner = GRPOBatchLearner(
        batch_size=n, num_generations=G, num_params=P, policy_version=0, scale_rewards=scale,
        source_backward=lambda source, bucket: backward(source.rollout.index) if source.scorable
        else SourceGradients(None, None, 5, off_policy_kl=kls[source.rollout.index]),
        release=release, content_backward=lambda rollout, bucket: backward(rollout.index),
        allow_unscorable_groups=True, off_policy_threshold=threshold,
        objective_weights=WEIGHTS if objective else None,
    )
    for i in order:
        rollout = Rollout(index=i, group=i // G, prompt_ids=(1,), completion_ids=(2, 3), policy_version=0)
        if release == "content":
            learner.submit_content(rollout)
    for i in order:
        rollout = Rollout(index=i, group=i // G, prompt_ids=(1,), completion_ids=(2, 3), policy_version=0)
        learner.submit(ScoredRollout(rollout, tuple(rewards[i]), weighted_sum(rewards[i], WEIGHTS), 0.0))
    return learner.finish()


def barrier_direction(totals, scale="group"):
    """What `ThunderSyncGRPOTrainer._barrier` does with the totals (one process, one bucket): −Σ_i A_i H_i."""
    if totals.objective_rewards is not None:
        r = torch.tensor(totals.objective_rewards, dtype=torch.float32)
        sigma, mean = nanstd(r), torch.nanmean(r)
        adv = torch.nan_to_num((r - mean) / (sigma + 1e-4), nan=0.0)
        for index, bucket, vector in totals.deferred:
            if adv[index] >= 0:
                totals.accumulator.add_final(vector, float(adv[index]), bucket)
        return totals.accumulator.direction({0: 1.0}, 1.0 / (float(sigma) + 1e-4), float(mean))
    policy_scale = 1.0
    if scale == "batch":
        policy_scale = 1.0 / (float(nanstd(torch.tensor(totals.rewards, dtype=torch.float32))) + 1e-4)
    return totals.accumulator.direction({0: 1.0}, policy_scale)


def close(got, expected):
    return torch.allclose(got, expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))


@pytest.mark.parametrize("release", ["reward", "content"])
def test_normalize_then_sum_matches_trl_in_every_order(release):
    torch.manual_seed(0)
    H = torch.randn(len(REWARDS), P)
    adv, normalized = trl_normalize_then_sum(REWARDS, WEIGHTS)
    expected = -(adv.unsqueeze(1) * H).sum(0)
    for seed in range(4):
        order = list(range(len(REWARDS)))
        random.Random(seed).shuffle(order)
        totals = run_learner(order, H, release=release)
        assert torch.allclose(torch.tensor(totals.objective_rewards), normalized, equal_nan=True)
        assert close(barrier_direction(totals), expected)
    # a naive port that normalizes the weighted sum per group (sum_then_normalize) gets another direction
    naive = -(trl_sum_then_normalize(REWARDS, WEIGHTS).unsqueeze(1) * H).sum(0)
    assert not close(naive, expected)


def test_normalize_then_sum_with_an_unscorable_group():
    """A group whose rows are all None (TRL: zero advantage) leaves the others' batch statistics as TRL has them."""
    torch.manual_seed(4)
    rewards = [[NAN, NAN, NAN]] * G + REWARDS[4:]
    H = torch.randn(len(rewards), P)
    adv, _ = trl_normalize_then_sum(rewards, WEIGHTS)
    kls = [0.9] * len(rewards)
    keep = trl_off_policy_keep(adv, kls, 0.5)
    expected = -((keep * adv).unsqueeze(1) * H).sum(0)
    totals = run_learner(list(reversed(range(len(rewards)))), H, kls=kls, threshold=0.5, rewards=rewards)
    assert close(barrier_direction(totals), expected)


def test_objective_group_statistics_skip_functions_without_spread():
    """A function with one finite value in the group has σ = NaN: TRL's nansum skips it; so does the fold."""
    torch.manual_seed(1)
    H = torch.randn(G, P)
    rows = REWARDS[4:8]  # function 1 has a single finite value here
    group = ObjectiveGroupStatistics(0, G, P, WEIGHTS)
    for i in (2, 0, 3, 1):
        group.add(weighted_sum(rows[i], WEIGHTS), H[i], index=i, rewards_per_func=tuple(rows[i]))
    weighted, scorable = group.fold()
    r = torch.tensor([group.normalized()[i] for i in range(G)])
    assert close(weighted[0], (r.unsqueeze(1) * H).sum(0))
    assert close(scorable[0], H.sum(0))


@pytest.mark.parametrize("objective,scale", [(False, "group"), (False, "batch"), (False, "none"), (True, "group")])
@pytest.mark.parametrize("release", ["reward", "content"])
def test_off_policy_mask_matches_trl(objective, scale, release):
    torch.manual_seed(2)
    H = torch.randn(len(REWARDS), P)
    kls = [0.9 if i % 3 != 1 else 0.1 for i in range(len(REWARDS))]  # most rows above the threshold
    if objective:
        adv, _ = trl_normalize_then_sum(REWARDS, WEIGHTS)
    else:
        adv = trl_sum_then_normalize(REWARDS, WEIGHTS, scale)
    keep = trl_off_policy_keep(adv, kls, 0.5)
    assert (keep == 0).sum() >= 2, "the case must drop some negative-advantage rows"
    expected = -((keep * adv).unsqueeze(1) * H).sum(0)
    for seed in range(3):
        order = list(range(len(REWARDS)))
        random.Random(seed).shuffle(order)
        totals = run_learner(order, H, objective=objective, scale=scale, kls=kls, threshold=0.5, release=release)
        got = barrier_direction(totals, scale)
        assert close(got, expected)
        if not objective:
            assert sorted(totals.off_policy_dropped) == sorted(torch.nonzero(keep == 0).view(-1).tolist())
    # unmasked, and a naive mask that also removes the dropped rows from μ and σ, both differ from TRL
    assert not close(-(adv.unsqueeze(1) * H).sum(0), expected)
    if not objective and scale == "group":
        naive_rewards = [r if keep[i] else [NAN] * 3 for i, r in enumerate(REWARDS)]
        naive = -(trl_sum_then_normalize(naive_rewards, WEIGHTS, scale).unsqueeze(1) * H).sum(0)
        assert not close(naive, expected)


def test_masked_buffers_count_in_memory_and_holding():
    torch.manual_seed(3)
    H = torch.randn(len(REWARDS), P)
    kls = [1.0] * len(REWARDS)
    plain = run_learner(list(range(len(REWARDS))), H, objective=False, kls=kls)
    masked = run_learner(list(range(len(REWARDS))), H, objective=False, kls=kls, threshold=0.5)
    assert masked.peak_stats_bytes > plain.peak_stats_bytes
    assert masked.peak_held >= G - 1  # a group's masked members wait for its close


def test_off_policy_kl_is_trls_masked_mean():
    logps = torch.tensor([[-1.0, -2.0, -3.0, -0.5]])
    sampled = torch.tensor([[-0.5, NAN, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert off_policy_kl(logps, sampled, mask) == pytest.approx((0.5 + 0.0 + 2.0) / 3)
    assert off_policy_kl(logps, None, mask) == 0.0
    assert off_policy_kl(logps, sampled, torch.zeros_like(mask)) == 0.0


@pytest.mark.parametrize("mode", [None, "token_mask"])
def test_turn_release_computes_the_same_off_policy_kl(mode):
    """release="turn": the statistic comes from the turns' recorded log-probs, equal to the whole trajectory's."""
    from tests.fixtures.turn_grpo import _rollout, _setup, _trajectories, _with_sampler
    from trl_thundersync.streaming.importance import SamplingCorrection

    policy, whole, turns = _setup("grpo", 0.0, 0.7, SamplingCorrection(mode, 0.8, 1.25) if mode else None)
    whole.off_policy_sampling = turns.off_policy_sampling = True
    for n, events in enumerate(_trajectories(policy.config.vocab_size)):
        events, rollout = _rollout(events, trailing=(3, 4, 5) if n == 0 else ())
        events, rollout = _with_sampler(events, rollout, policy, scale=0.3, seed=n)
        for event in events:
            turns.turn(event)
        ours = turns.finish(rollout, 0)
        expected = whole(ScoredRollout(rollout, (1.0,), 1.0, 0.0), 0)
        assert ours is not None and expected.off_policy_kl != 0.0
        # the statistic (~0.016) is a mean of differences of FP32 log-probs (~5, each rounded to ~5e-7) that the turn
        # passes and the whole-trajectory pass compute in different partitions: the rounding is absolute (~3e-7 seen)
        assert ours.off_policy_kl == pytest.approx(expected.off_policy_kl, rel=1e-5, abs=1e-6)
