"""The learner's off-policy sequence mask and per-row tallies, on hand-made vectors (no model)."""

from __future__ import annotations

import math

import torch

from trl_thundersync.streaming.accumulators import BatchAccumulator
from trl_thundersync.streaming.learner_records import SourceGradients, TrajectoryTallies
from trl_thundersync.streaming.off_policy_mask import OffPolicyMask


def grads(kl: float) -> SourceGradients:
    return SourceGradients(torch.ones(2), None, 3, off_policy_kl=kl)


def test_hold_masks_only_rows_above_the_threshold():
    mask = OffPolicyMask(threshold=0.5, defer=False)
    h = torch.tensor([1.0, 2.0])
    assert mask.hold(0, 0, grads(0.5), h) is h  # not above: folds with its group
    assert mask.hold(1, 0, grads(0.7), h) is None
    assert mask.hold(2, 0, grads(0.9), None) is None  # unscorable: nothing to hold
    assert list(mask.masked) == [1] and mask.held() == 1 and mask.nbytes() == 8
    assert OffPolicyMask(threshold=None, defer=False).hold(0, 0, grads(99.0), h) is h


def test_close_folds_non_negative_advantages_and_drops_negative_ones():
    mask, acc = OffPolicyMask(threshold=0.0, defer=False), BatchAccumulator(2)
    for index in range(3):
        mask.hold(index, 0, grads(1.0), torch.tensor([1.0, 10.0]) * (index + 1))
    rewards = [2.0, 0.0, 1.0]  # mean 1: A_0 > 0, A_1 < 0, A_2 = 0
    mask.close(range(0, 3), rewards, mean=1.0, scale=0.5, accumulator=acc)
    assert mask.dropped == [1] and not mask.masked and mask.held() == 0
    torch.testing.assert_close(acc.policy[0], torch.tensor([0.5, 5.0]) + torch.tensor([3.0, 30.0]) * 0.0)


def test_close_skips_rows_of_other_groups_and_non_finite_scales():
    mask, acc = OffPolicyMask(threshold=0.0, defer=False), BatchAccumulator(2)
    mask.hold(0, 0, grads(1.0), torch.ones(2))
    mask.hold(2, 0, grads(1.0), torch.ones(2))
    mask.close(range(0, 2), [1.0, 0.0, 1.0], mean=0.5, scale=math.nan, accumulator=acc)
    assert list(mask.masked) == [2] and not mask.dropped and not acc.policy


def test_defer_hands_masked_rows_to_the_barrier_and_clear_frees_them():
    mask, acc = OffPolicyMask(threshold=0.0, defer=True), BatchAccumulator(2)
    mask.hold(1, 3, grads(1.0), torch.ones(2))
    mask.close(range(0, 2), [0.0, -5.0], mean=0.0, scale=1.0, accumulator=acc)
    assert [(i, b) for i, b, _ in mask.deferred] == [(1, 3)] and not mask.dropped and not acc.policy
    assert mask.held() == 1
    mask.clear()
    assert mask.held() == 0 and mask.nbytes() == 0


def test_tallies_start_empty_and_record_a_backward():
    tallies = TrajectoryTallies.empty(2)
    assert math.isnan(tallies.rewards[0]) and tallies.tokens == [0, 0] and tallies.policy_values == [None, None]
    tallies.record(1, SourceGradients(None, None, 7, free_value=0.25, kl_sum=1.5, entropy_sum=2.0, policy_value=3.0))
    assert (tallies.tokens[1], tallies.free_values[1], tallies.kl_sums[1]) == (7, 0.25, 1.5)
    assert (tallies.entropy_sums[1], tallies.policy_values[1]) == (2.0, 3.0)
    assert tallies.tokens[0] == 0 and math.isnan(tallies.objective_rewards[1])
