"""Per-run figures of `benchmarks/realgen.py` that are not the GRPO step statistics of `benchmarks/stats.py`: the
episodes both GRPO trainers log, and the distillation run's R, L, ρ and tail (its traces have no rewards to replay)."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any


def _f(x: float | None, spec: str, suffix: str = "") -> str:
    return "-" if x is None else format(x, spec) + suffix


# the episode figures both GRPO trainers log per step, with TRL's definitions (lengths: model tokens, tool mask 1)
EPISODE_KEYS = ("completions/mean_length", "completions/max_length", "completions/clipped_ratio",
                "tools/call_frequency")


def episode_log(log_history: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per logged training step, the `EPISODE_KEYS` values (steps without completion metrics are skipped)."""
    return [{k: float(h[k]) for k in EPISODE_KEYS if k in h} for h in log_history if "completions/mean_length" in h]


def episode_rows(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per GRPO schedule, from its runs' `episodes`: model tokens per trajectory at step 1 (the initial weights, the
    same for every schedule: episodes must agree there) and over all steps (mean and range of the step means), tool
    calls per trajectory. Runs without `episodes` (reports older than this field) are skipped."""
    rows = []
    for name, results in runs.items():
        steps = [r["episodes"] for r in results if r.get("episodes") and name != "gkd"]
        if not steps:
            continue
        first = [s[0]["completions/mean_length"] for s in steps]
        every = [e["completions/mean_length"] for s in steps for e in s]
        calls = [e["tools/call_frequency"] for s in steps for e in s if "tools/call_frequency" in e]
        rows.append({"schedule": name, "runs": len(steps), "step1_model_tokens": statistics.fmean(first),
                     "model_tokens": statistics.fmean(every), "model_tokens_min": min(every),
                     "model_tokens_max": max(every), "tool_calls": statistics.fmean(calls) if calls else None})
    return rows


def format_episode_rows(rows: list[dict[str, Any]]) -> list[str]:
    head = ("| schedule | runs | model tokens / trajectory, step 1 | all steps: mean (range of step means) | "
            "tool calls / trajectory |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(f"| {r['schedule']} | {r['runs']} | {r['step1_model_tokens']:.1f} | {r['model_tokens']:.1f} "
                     f"({r['model_tokens_min']:.1f}–{r['model_tokens_max']:.1f}) | {_f(r['tool_calls'], '.2f')} |")
    return lines


@dataclasses.dataclass(frozen=True)
class DistillSummary:
    """The distillation run's figures realgen reports (its traces have no rewards, so `stats.summarize`, which
    replays every GRPO release point, does not apply): means over the measured steps, s."""

    steps: int
    step_wall_s: float
    rollout_s: float  # R: batch admitted → last trajectory scored by the teacher
    learner_busy_s: float  # L
    balance_ratio: float  # L/R
    learner_tail_s: float  # [c_n − R]⁺
    turn_busy_s: float | None  # median rollout turn with the learner busy (`stats.overlap_split`)
    turn_idle_s: float | None
    replay_thundersync_s: float  # Eq. 14 replay of its own steps (`stats.predict_thundersync`)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def summarize_distill(runs: list[Any]) -> DistillSummary:
    """`DistillSummary` of `stats.RunSteps` (warm-up dropped) from the distillation trainer."""
    from .stats import overlap_split, predict_thundersync

    walls = [w for r in runs for w in r.walls]
    traces = [t for r in runs for t in r.traces]
    if not traces:
        raise ValueError("summarize_distill needs at least one measured step")
    reps = [predict_thundersync(t) for t in traces]
    busy, idle = overlap_split(traces, "rollout", "turn")
    return DistillSummary(
        steps=len(traces), step_wall_s=statistics.fmean(walls),
        rollout_s=statistics.fmean(r.rollout_end for r in reps),
        learner_busy_s=statistics.fmean(r.learner_service for r in reps),
        balance_ratio=statistics.fmean(r.balance_ratio for r in reps),
        learner_tail_s=statistics.fmean(max(0.0, t.learner_end - t.rollout_end) for t in traces),
        turn_busy_s=statistics.median(busy) if busy else None, turn_idle_s=statistics.median(idle) if idle else None,
        replay_thundersync_s=statistics.fmean(r.thundersync_time for r in reps))
