"""Batch metrics of rollouts: TRL's completion lengths and the agent loop's statistics (logged through TRL's
`report_to` next to its own `tools/*` metrics). Pure: with several processes the trainer hands them every process's
values (`trainers/grpo/metrics.py`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from ...types import AgentStats


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def model_token_counts(completion_ids: Sequence[Sequence[int]],
                       env_masks: Sequence[Sequence[int] | None]) -> list[int]:
    """Per completion, the tokens TRL's `completions/*_length` metrics count: the model's own (mask 1) when there is
    a tool/environment mask, else all of them (`GRPOTrainer._generate`: "count only model-generated tokens")."""
    return [len(ids) if mask is None else sum(mask) for ids, mask in zip(completion_ids, env_masks, strict=True)]


def truncation_flags(completion_ids: Sequence[Sequence[int]], eos_and_pad: set[int] | frozenset[int]) -> list[bool]:
    """Per completion, TRL's `is_truncated`: the last token is neither EOS nor pad (an empty completion, where TRL
    would fail, counts as not truncated)."""
    return [bool(ids) and ids[-1] not in eos_and_pad for ids in completion_ids]


def length_metrics(lengths: Sequence[int], truncated: Sequence[bool]) -> dict[str, float]:
    """TRL 1.16's completion-length metrics (`GRPOTrainer._generate`) of a whole batch — with several processes,
    every process's `lengths` (model tokens, `model_token_counts`) and `truncated` flags concatenated, as TRL's
    gather leaves them: mean/min/max length, the share truncated, mean/min/max length of the others (0 when every
    completion was truncated). Computed in float32 as TRL does, so the values are TRL's to the bit."""
    if not lengths:
        return {}
    agg = torch.tensor(list(lengths), dtype=torch.float32)
    cut = torch.tensor(list(truncated), dtype=torch.bool)
    terminated = agg[~cut]
    if terminated.numel() == 0:
        terminated = torch.zeros(1)
    return {
        "completions/mean_length": agg.mean().item(),
        "completions/min_length": agg.min().item(),
        "completions/max_length": agg.max().item(),
        "completions/clipped_ratio": cut.float().mean().item(),
        "completions/mean_terminated_length": terminated.mean().item(),
        "completions/min_terminated_length": terminated.min().item(),
        "completions/max_terminated_length": terminated.max().item(),
    }


def agent_metrics(stats: Sequence[AgentStats]) -> dict[str, float]:
    """Aggregate per-trajectory statistics of one batch; empty when the batch was not agentic."""
    if not stats:
        return {}
    n = len(stats)
    calls = sum(s.tool_calls for s in stats)
    latencies = [t for s in stats for t in s.tool_seconds]
    walls = [s.wall_seconds for s in stats]
    out = {
        "tools/call_frequency": calls / n,  # same meaning as TRL's: calls per completion
        # TRL's meaning under agent_protocol="trl" (failed calls / calls); the paper's also counts unparsable calls
        "tools/failure_frequency": sum(s.tool_failures for s in stats) / max(calls + sum(
            s.parse_errors for s in stats if s.protocol == "paper"), 1),
        "agent/turns_mean": sum(s.turns for s in stats) / n,
        "agent/turns_max": float(max(s.turns for s in stats)),
        "agent/parse_errors": float(sum(s.parse_errors for s in stats)),
        "agent/observation_truncations": float(sum(s.observation_truncations for s in stats)),
        "agent/tool_latency_p50": _percentile(latencies, 0.5),
        "agent/tool_latency_p90": _percentile(latencies, 0.9),
        "agent/tool_latency_p99": _percentile(latencies, 0.99),
        "agent/trajectory_seconds_mean": sum(walls) / n,
        "agent/trajectory_seconds_max": max(walls),
    }
    for reason, count in Counter(s.stop_reason for s in stats).items():
        out[f"agent/stop_{reason}"] = count / n
    return out
