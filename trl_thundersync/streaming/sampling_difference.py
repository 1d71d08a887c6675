"""How far the sampler's log-probs are from the learner's: TRL 1.16's `sampling/*` metrics.

TRL (`GRPOTrainer._generate_and_score_completions`, with `use_vllm` and the vLLM importance-sampling correction)
logs once per generation batch, from the learner's log-probs at θ_k and the ones the server returned:

    d_t = |log π_θk(o_t) − log π_sampler(o_t)|   over loss tokens (completion mask × tool mask) whose sampler
                                                 log-prob is known (NaN: excluded, not counted as 0)
    sampling/sampling_logp_difference/mean      mean over processes of each process's mean d_t (0 when it has none)
    sampling/sampling_logp_difference/max       max over processes of each process's max d_t (0 when it has none)
    sampling/importance_sampling_ratio/min|mean|max
                                                nanmin / nanmean / nanmax over processes of each process's min / mean /
                                                max of the correction's weights c (`importance.py`; 0 when it has
                                                none): one per loss token (token modes), one per row (sequence modes,
                                                every row, masked ones too)

So the mean is TRL's mean of per-process means, not a token-weighted mean over the batch: it depends on how the
batch is split across processes (as TRL's does).

A trajectory's backward computes its `SamplingStats` from the log-probs it computes anyway (`source.py`,
`turn_grpo.py`); the learner keeps them per row (`BatchTotals.sampling`), each process `merge`s its rows at the
barrier and `sampling_metrics` reduces the processes' as TRL does (`trainers/grpo/metrics.py`). ThunderSync logs the
difference whenever the rollouts carry sampler log-probs (every engine of this package returns them), not only with
`use_vllm`: it is how a run shows it is on-policy; the ratio only when the correction is on, as TRL.

Run the tests: `pytest tests/unit/streaming/test_sampling_difference.py`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from .importance import SamplingCorrection

DIFFERENCE = "sampling/sampling_logp_difference"
RATIO = "sampling/importance_sampling_ratio"


@dataclass(frozen=True)
class SamplingStats:
    """Sums and extremes of d_t and of the correction's weights over some rows (one trajectory, or a process's)."""

    difference_sum: float = 0.0  # Σ d_t over loss tokens with a known sampler log-prob
    difference_count: int = 0  # how many tokens that sum has
    difference_max: float = -math.inf  # max d_t (−inf: no token)
    ratio_sum: float = 0.0  # Σ c over the weights TRL reports (0 without the correction)
    ratio_count: int = 0
    ratio_min: float = math.inf  # (+inf: no weight)
    ratio_max: float = -math.inf  # (−inf: no weight)

    def process_values(self) -> tuple[float, float, float, float, float]:
        """One process's (mean d, max d, min c, mean c, max c), each 0.0 when it has no value, as TRL's."""
        mean = self.difference_sum / self.difference_count if self.difference_count else 0.0
        largest = self.difference_max if self.difference_count else 0.0
        if not self.ratio_count:
            return mean, largest, 0.0, 0.0, 0.0
        return mean, largest, self.ratio_min, self.ratio_sum / self.ratio_count, self.ratio_max


def row_stats(logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor,
              correction: SamplingCorrection | None = None) -> SamplingStats:
    """One trajectory's `SamplingStats`: `logps` (the learner's at θ_k), `sampling_logps` (NaN where unknown) and the
    loss `mask` are [1, T]; `correction` adds its weights' statistics."""
    logps = logps.detach().float()
    sampled = sampling_logps.to(logps.device).float()
    mask = mask.to(logps.device)
    difference = (logps - sampled).abs()
    difference = difference[mask.bool() & ~torch.isnan(difference)]
    stats = SamplingStats()
    if difference.numel():
        stats = SamplingStats(float(difference.double().sum()), int(difference.numel()), float(difference.max()))
    if correction is None:
        return stats
    weights = correction.weights(logps, sampled, mask)
    weights = weights.flatten() if correction.mode.startswith("sequence") else weights[mask.bool()]
    if not weights.numel():
        return stats
    return SamplingStats(stats.difference_sum, stats.difference_count, stats.difference_max,
                         float(weights.double().sum()), int(weights.numel()), float(weights.min()),
                         float(weights.max()))


def merge(rows: Iterable[SamplingStats]) -> SamplingStats:
    """The statistics of several rows together (a process's, at the barrier)."""
    total = SamplingStats()
    for s in rows:
        total = SamplingStats(total.difference_sum + s.difference_sum, total.difference_count + s.difference_count,
                              max(total.difference_max, s.difference_max), total.ratio_sum + s.ratio_sum,
                              total.ratio_count + s.ratio_count, min(total.ratio_min, s.ratio_min),
                              max(total.ratio_max, s.ratio_max))
    return total


def _nan_reduce(values: Sequence[float], reduce) -> float:
    """TRL's nanmin / nanmax / nanmean of the gathered per-process values (NaN when all are NaN)."""
    kept = [v for v in values if not math.isnan(v)]
    return reduce(kept) if kept else math.nan


def sampling_metrics(processes: Sequence[SamplingStats], ratio: bool) -> dict[str, float]:
    """TRL's `sampling/*` metrics of a batch from each process's merged statistics (rank order); `ratio`: the
    importance-sampling correction is on, so the ratio's three keys are logged too."""
    values = [p.process_values() for p in processes]
    out = {f"{DIFFERENCE}/mean": sum(v[0] for v in values) / len(values),
           f"{DIFFERENCE}/max": max(v[1] for v in values)}
    if ratio:
        out[f"{RATIO}/min"] = _nan_reduce([v[2] for v in values], min)
        out[f"{RATIO}/mean"] = _nan_reduce([v[3] for v in values], lambda kept: sum(kept) / len(kept))
        out[f"{RATIO}/max"] = _nan_reduce([v[4] for v in values], max)
    return out
