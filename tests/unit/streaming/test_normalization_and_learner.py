"""Loss normalizers and the batch learner, with hand-written fakes (no model)."""

from __future__ import annotations

import math

import pytest
import torch

from trl_thundersync.errors import BatchIncompleteError, StalePolicyError, UnscorableGroupError
from trl_thundersync.streaming.learner import GRPOBatchLearner, SourceGradients
from trl_thundersync.streaming.normalization import LossNormalization, micro_batch_of
from trl_thundersync.types import Rollout, ScoredRollout


def norm(loss_type, b=8, ga=1, max_len=16):
    return LossNormalization(loss_type, b, ga, max_len)


def test_per_sequence_and_barrier_factors():
    assert norm("grpo").sequence_weight(4) == 0.25 and norm("grpo").sequence_weight(0) == 1.0
    assert norm("dapo").sequence_weight(4) == 1.0
    assert norm("grpo").bucket_scales({0: 10}, 10) == {0: 1 / 8}
    assert norm("dr_grpo").bucket_scales({0: 10}, 10) == {0: 1 / (8 * 16)}
    assert norm("dapo").bucket_scales({0: 10}, 10) == {0: 0.1}
    assert norm("bnpo", ga=2).uses_buckets and not norm("bnpo").uses_buckets
    assert norm("bnpo", ga=2).bucket_scales({0: 4, 1: 6}, 10) == {0: 1 / 8, 1: 1 / 12}
    assert norm("dapo").bucket_scales({0: 0}, 0) == {0: 1.0}  # clamp(min=1) as in TRL


def test_micro_batch_of_matches_trl_shuffle_then_split():
    from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

    torch.manual_seed(3)
    perm = torch.randperm(8).tolist()
    torch.manual_seed(3)
    shuffled = shuffle_sequence_dict({"row": torch.arange(8)})
    parts = split_tensor_dict(shuffled, 2)
    mapping = micro_batch_of(perm, 2)
    for k, part in enumerate(parts):
        assert all(mapping[int(r)] == k for r in part["row"])


def source(index, reward, version=0, g=2):
    r = Rollout(index=index, group=index // g, policy_version=version, prompt_ids=(1,), completion_ids=(2, 3))
    return ScoredRollout(r, (reward,), reward, 0.0)


def learner(**kw):
    calls = []

    def backward(src, bucket):
        calls.append(src.rollout.index)
        vec = torch.zeros(4)
        vec[src.rollout.index % 4] = 1.0
        return SourceGradients(vec, None, 2)

    defaults = dict(batch_size=4, num_generations=2, num_params=4, policy_version=0, scale_rewards="group",
                    source_backward=backward)
    defaults.update(kw)
    return GRPOBatchLearner(**defaults), calls


def test_stale_version_is_refused_with_a_typed_error():
    lrn, _ = learner(policy_version=3)
    with pytest.raises(StalePolicyError, match="version 2.*version 3"):
        lrn.submit(source(0, 1.0, version=2))


def test_duplicate_and_missing_trajectories_fail_the_barrier():
    lrn, _ = learner()
    lrn.submit(source(0, 1.0))
    with pytest.raises(BatchIncompleteError, match="delivered twice"):
        lrn.submit(source(0, 1.0))
    with pytest.raises(BatchIncompleteError, match="3 trajectories never delivered"):
        lrn.finish()


def test_unscorable_group_raises_unless_allowed():
    lrn, _ = learner()
    lrn.submit(source(0, math.nan))
    with pytest.raises(UnscorableGroupError, match="group 0"):
        lrn.submit(source(1, math.nan))
    lrn, _ = learner(allow_unscorable_groups=True)
    for i, r in enumerate([math.nan, math.nan, 1.0, 0.0]):
        lrn.submit(source(i, r))
    totals = lrn.finish()
    assert math.isnan(totals.rewards[0]) and totals.rewards[2] == 1.0


def test_admission_cap_parks_sources_of_new_groups():
    lrn, calls = learner(batch_size=6, max_open_groups=1)
    lrn.submit(source(0, 1.0))  # opens group 0
    lrn.submit(source(2, 0.0))  # group 1 must wait
    lrn.submit(source(4, 0.0))  # group 2 must wait
    assert calls == [0] and len(lrn.pending) == 2
    lrn.submit(source(1, 0.0))  # closes group 0 → group 1 admitted
    assert calls[:3] == [0, 1, 2]
    for i in (3, 5):
        lrn.submit(source(i, 1.0))
    totals = lrn.finish()
    assert sorted(calls) == list(range(6))
    assert totals.peak_stats_bytes <= 4 * (2 * 1 + 1) * 4
    kinds = [w.kind for w in totals.work]
    assert kinds.count("group_fold") == 3 and kinds.count("trajectory") == 6
