"""Group sufficient statistics reproduce Σ_i A_i H_i exactly, in any arrival order, with TRL's NaN semantics."""

from __future__ import annotations

import math
import random

import pytest
import torch
from trl.trainer.utils import nanstd

from trl_thundersync.streaming.accumulators import (
    BatchAccumulator,
    GroupStatistics,
    nanmean,
    nanstd_bessel,
    stats_memory_bytes,
)


def trl_advantages(rewards, eps=1e-4, scale="group"):
    r = torch.tensor(rewards, dtype=torch.float32)
    mean = torch.nanmean(r)
    std = nanstd(r)
    adv = r - mean if scale == "none" else (r - mean) / (std + eps)
    return torch.nan_to_num(adv, nan=0.0)


@pytest.mark.parametrize("rewards", [
    [1.0, 0.0, 0.5, 2.0],
    [1000.0, 1000.5, 999.0, 1001.0],  # large common offset: the shift keeps G1 − μG2 well conditioned
    [1.0, math.nan, 0.0, 3.0],  # one unscorable member
    [math.nan, 2.0, math.nan, math.nan],  # a single scorable member: σ is NaN, advantages are 0
    [0.5, 0.5, 0.5, 0.5],  # zero spread
])
@pytest.mark.parametrize("scale", ["group", "none"])
def test_fold_equals_direct_sum_for_every_order(rewards, scale):
    torch.manual_seed(0)
    H = torch.randn(len(rewards), 50)
    adv = trl_advantages(rewards, scale=scale)
    expected = (adv.unsqueeze(1) * H).sum(0)
    for seed in range(4):
        order = list(range(len(rewards)))
        random.Random(seed).shuffle(order)
        g = GroupStatistics(0, len(rewards), 50)
        for i in order:
            g.add(rewards[i], None if math.isnan(rewards[i]) else H[i])
        s = 1.0 / (g.std + 1e-4) if scale == "group" else 1.0
        got = g.fold(s).get(0, torch.zeros(50))
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max().clamp(min=1.0)))


def test_statistics_match_trl_helpers():
    values = [1.0, math.nan, 4.0, 2.5]
    assert nanmean(values) == pytest.approx(float(torch.nanmean(torch.tensor(values))))
    assert nanstd_bessel(values) == pytest.approx(float(nanstd(torch.tensor(values))))
    assert math.isnan(nanstd_bessel([1.0, math.nan]))


def test_group_refuses_extra_members_and_early_folds():
    g = GroupStatistics(3, 2, 4)
    g.add(1.0, torch.ones(4))
    with pytest.raises(ValueError, match="folded with 1/2"):
        g.fold(1.0)
    g.add(0.0, torch.zeros(4))
    with pytest.raises(ValueError, match="already has its 2 members"):
        g.add(1.0, torch.ones(4))


def test_buckets_are_kept_apart_and_memory_is_reported():
    g = GroupStatistics(0, 2, 3)
    g.add(1.0, torch.tensor([1.0, 0.0, 0.0]), bucket=0)
    g.add(0.0, torch.tensor([0.0, 1.0, 0.0]), bucket=1)
    folded = g.fold(1.0)
    assert set(folded) == {0, 1}
    assert torch.allclose(folded[0], torch.tensor([0.5, 0.0, 0.0]))
    assert torch.allclose(folded[1], torch.tensor([0.0, -0.5, 0.0]))
    assert g.nbytes() == 2 * 2 * 3 * 4
    acc = BatchAccumulator(3)
    acc.add_policy(folded)
    acc.add_free(torch.tensor([0.0, 0.0, 2.0]), bucket=1)
    direction = acc.direction({0: 1.0, 1: 0.5})
    assert torch.allclose(direction, torch.tensor([-0.5, 0.25, 1.0]))
    assert stats_memory_bytes(1000, 4) == 4 * 9 * 1000


def test_fold_consumes_its_statistics_in_place_with_the_same_bits():
    """Issue 40: the fold was the run's peak at 43 M parameters (two P-sized temporaries per group close). In place,
    it must give the very bits of the out-of-place formula, in G1's own buffer, and refuse a second fold."""
    torch.manual_seed(0)
    H = torch.randn(4, 1000)
    rewards = [3.0, -1.5, 0.25, 7.0]
    g = GroupStatistics(0, 4, 1000)
    for r, h in zip(rewards, H, strict=True):
        g.add(r, h)
    g1, g2 = g.buckets[0].g1.clone(), g.buckets[0].g2.clone()
    scale = 1.0 / (g.std + 1e-4)
    expected = (g1 - (g.mean - g.shift) * g2) * scale
    pointer = g.buckets[0].g1.data_ptr()
    folded = g.fold(scale)[0]
    assert torch.equal(folded, expected)
    assert folded.data_ptr() == pointer  # no new parameter-sized buffer
    with pytest.raises(ValueError, match="folded already"):
        g.fold(scale)


def test_accumulator_adopts_a_handed_over_vector_and_copies_a_view():
    acc = BatchAccumulator(6)
    fresh = torch.arange(6, dtype=torch.float32)
    acc.add_policy({0: fresh})
    assert acc.policy[0] is fresh  # adopted: no zeros buffer beside it
    acc.add_policy({0: torch.ones(6)})
    assert torch.equal(fresh, torch.arange(6, dtype=torch.float32) + 1)
    backing = torch.zeros(12)
    view = backing[:6]
    acc.add_free(view, 1)
    assert acc.free_terms[1].data_ptr() != view.data_ptr()  # a view into a larger buffer is copied, never adopted
    acc.add_free(torch.ones(6), 1)
    assert torch.equal(backing, torch.zeros(12))
    half = torch.ones(6, dtype=torch.float64)
    acc.add_offset({2: half})
    assert acc.offset_terms[2].dtype == torch.float32
