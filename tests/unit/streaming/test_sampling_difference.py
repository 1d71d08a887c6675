"""TRL's `sampling/*` metrics (`streaming/sampling_difference.py`): per-row statistics from the learner's and the
sampler's log-probs, merged per process and reduced over processes exactly as TRL 1.16's
`_generate_and_score_completions` reduces its gathered tensors; and the learner's backward hands them on."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from tests.fixtures.batch_logs import RANK0, RANK1, SETTINGS  # two fake processes' payloads
from trl_thundersync.streaming.importance import SamplingCorrection
from trl_thundersync.streaming.normalization import LossNormalization
from trl_thundersync.streaming.sampling_difference import SamplingStats, merge, row_stats, sampling_metrics
from trl_thundersync.streaming.source import TrajectoryBackward
from trl_thundersync.trainers.grpo.metrics import batch_metrics
from trl_thundersync.types import Rollout, ScoredRollout

NAN = math.nan


def process_rows(seed: int, rows: int, width: int = 6):
    """One process's padded batch as TRL holds it: learner log-probs [B, T], sampler's (some NaN) and the loss mask
    (one row fully masked: a masked truncation)."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, width, generator=g) * 3
    sampled = old + torch.randn(rows, width, generator=g) * 0.05
    sampled[0, 1] = NAN  # a token vLLM could not score
    mask = (torch.rand(rows, width, generator=g) > 0.25).float()
    mask[0, 1] = 1.0
    mask[-1] = 0.0
    return old, sampled, mask


def trl_reference(processes, correction: SamplingCorrection | None) -> dict[str, float]:
    """TRL 1.16's formulas, written from its code: per process the masked, NaN-free |old − sampled| (mean, max; 0
    when empty) and the weights' (min, mean, max; per masked token or per row), then over the gathered per-process
    values mean / max and nanmin / nanmean / nanmax."""
    means, maxes, mins, ratio_means, ratio_maxes = [], [], [], [], []
    for old, sampled, mask in processes:
        delta = torch.abs(old - sampled)
        delta = delta[mask.bool() & ~torch.isnan(delta)]
        means.append(delta.mean() if delta.numel() else torch.tensor(0.0))
        maxes.append(delta.max() if delta.numel() else torch.tensor(0.0))
        if correction is not None:
            diff = torch.nan_to_num((old - sampled) * mask, nan=0.0)
            if correction.mode.startswith("sequence"):
                diff = diff.sum(dim=-1, keepdim=True)
            ratio = torch.exp(diff)
            if correction.mode.endswith("truncate"):
                ratio = torch.clamp(ratio, min=correction.clip_min, max=correction.clip_max)
            else:
                ratio = ratio.masked_fill((ratio < correction.clip_min) | (ratio > correction.clip_max), 0.0)
            flat = ratio.flatten() if correction.mode.startswith("sequence") else ratio[mask.bool()]
            mins.append(flat.min() if flat.numel() else torch.tensor(0.0))
            ratio_means.append(flat.mean() if flat.numel() else torch.tensor(0.0))
            ratio_maxes.append(flat.max() if flat.numel() else torch.tensor(0.0))
    out = {"sampling/sampling_logp_difference/mean": torch.stack(means).mean().item(),
           "sampling/sampling_logp_difference/max": torch.stack(maxes).max().item()}
    if correction is not None:
        out["sampling/importance_sampling_ratio/min"] = torch.stack(mins).min().item()
        out["sampling/importance_sampling_ratio/mean"] = torch.stack(ratio_means).nanmean().item()
        out["sampling/importance_sampling_ratio/max"] = torch.stack(ratio_maxes).max().item()
    return out


def ours(processes, correction: SamplingCorrection | None) -> dict[str, float]:
    merged = [merge(row_stats(old[i:i + 1], sampled[i:i + 1], mask[i:i + 1], correction) for i in range(len(old)))
              for old, sampled, mask in processes]
    return sampling_metrics(merged, ratio=correction is not None)


@pytest.mark.parametrize("mode", [None, "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_two_processes_reduce_as_trl(mode):
    correction = None if mode is None else SamplingCorrection(mode, 0.97, 1.02)
    processes = [process_rows(0, 4), process_rows(1, 3)]
    expected, got = trl_reference(processes, correction), ours(processes, correction)
    assert got.keys() == expected.keys()
    for key in expected:
        assert got[key] == pytest.approx(expected[key], rel=1e-6, abs=1e-9), key
    if mode is not None and mode.endswith("mask"):
        assert got["sampling/importance_sampling_ratio/min"] == 0.0  # some weight fell outside [0.97, 1.02]


def test_the_mean_is_a_mean_of_process_means_not_a_token_mean():
    """TRL's reduction: a process with one token weighs as much as one with many (and an empty one adds a 0)."""
    many = SamplingStats(difference_sum=10 * 0.1, difference_count=10, difference_max=0.1)
    one = SamplingStats(difference_sum=0.5, difference_count=1, difference_max=0.5)
    metrics = sampling_metrics([many, one], ratio=False)
    assert metrics["sampling/sampling_logp_difference/mean"] == pytest.approx((0.1 + 0.5) / 2)
    assert metrics["sampling/sampling_logp_difference/max"] == 0.5
    assert sampling_metrics([many, SamplingStats()], ratio=True) == pytest.approx({
        "sampling/sampling_logp_difference/mean": 0.05, "sampling/sampling_logp_difference/max": 0.1,
        "sampling/importance_sampling_ratio/min": 0.0, "sampling/importance_sampling_ratio/mean": 0.0,
        "sampling/importance_sampling_ratio/max": 0.0})


def test_batch_metrics_log_the_keys_only_when_every_process_has_sampler_logprobs():
    stats = SamplingStats(difference_sum=2e-6, difference_count=4, difference_max=1e-6, ratio_sum=4.0, ratio_count=4,
                          ratio_min=0.999, ratio_max=1.001)
    both = [replace(RANK0, sampling=stats), replace(RANK1, sampling=stats)]
    metrics = batch_metrics(both, replace(SETTINGS, importance_sampling=True))
    assert metrics["sampling/sampling_logp_difference/mean"] == pytest.approx([5e-7])
    assert metrics["sampling/importance_sampling_ratio/max"] == [1.001]
    assert "sampling/importance_sampling_ratio/min" not in batch_metrics(both, SETTINGS)
    assert not any(k.startswith("sampling/") for k in batch_metrics([both[0], RANK1], SETTINGS))


class LinearLogProbs(torch.nn.Module):
    """log π(token | position) from a learnable table: enough for a backward with real gradients."""

    def __init__(self, vocab: int = 8, length: int = 16) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(length, vocab, generator=torch.Generator().manual_seed(0)))

    def __call__(self, ids, attention, keep):
        logits = self.table[: ids.shape[1]]
        logps = torch.log_softmax(logits, -1).gather(-1, ids[0].unsqueeze(-1)).squeeze(-1)
        return logps[-keep:].unsqueeze(0)


@pytest.mark.parametrize("scorable", [True, False])
def test_the_backward_reports_each_rows_statistics(scorable):
    model = LinearLogProbs()
    normalization = LossNormalization("dapo", batch_size=2, micro_batches=1, max_completion_length=8)
    backward = TrajectoryBackward(params=[model.table], logps_fn=model, eos_and_pad=[0], mask_truncated=False,
                                  normalization=normalization,
                                  correction=SamplingCorrection("token_truncate", None, 3.0))
    prompt, completion = (1, 2, 3), (4, 5, 0)
    ids = torch.tensor([prompt + completion])
    learner = model(ids, None, 3).detach()
    sampled = (learner[0] + torch.tensor([1e-3, -2e-3, 0.0])).tolist()
    rollout = Rollout(index=0, group=0, policy_version=0, prompt_ids=prompt, completion_ids=completion,
                      sampling_logprobs=tuple(sampled), env_mask=(1, 0, 1))
    grads = backward(ScoredRollout(rollout, (1.0,), 1.0 if scorable else NAN, 0.0), 0)
    assert (grads.score_grad is not None) == scorable  # unscorable: no H_i, but the statistics still count
    assert grads.sampling.difference_count == 2  # the tool token (env_mask 0) is not compared
    assert grads.sampling.difference_max == pytest.approx(1e-3, rel=1e-3)
    assert grads.sampling.ratio_count == 2 and grads.sampling.ratio_min == pytest.approx(math.exp(-1e-3), rel=1e-6)
    without = Rollout(index=1, group=0, policy_version=0, prompt_ids=prompt, completion_ids=completion)
    uncorrected = TrajectoryBackward(params=[model.table], logps_fn=model, eos_and_pad=[0], mask_truncated=False,
                                     normalization=normalization)
    assert uncorrected(ScoredRollout(without, (1.0,), 1.0, 0.0), 0).sampling is None
    assert uncorrected(ScoredRollout(rollout, (1.0,), 1.0, 0.0), 0).sampling.ratio_count == 0
