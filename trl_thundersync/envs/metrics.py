"""Batch metrics of agentic rollouts (logged through TRL's `report_to` next to its own `tools/*` metrics)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ..types import AgentStats


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


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
