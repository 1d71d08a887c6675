"""The metrics and completions table of one GRPO logical batch, as stock TRL logs them with several processes.

TRL computes its batch metrics on values gathered from every process — `GRPOTrainer._generate`: the completion
lengths, the clipped ratio, `tools/*`, `num_tokens`; `_generate_and_score_completions`: `rewards/<f>/mean|std`,
`reward`, `reward_std`, `frac_reward_zero_std`, the `log_metric` averages and the completions table (prompts,
completions, rewards, advantages, `log_extra` columns); `_compute_loss`: `kl` and the clip ratios, one global value
per micro-batch. So every rank logs the same numbers, and they are the one-process run's on the same global batch.
ThunderSync streams each process's own trajectories; at the barrier each process packs what it contributes into one
`ProcessBatchLog`, one `gather_object` hands every process all of them (rank order: TRL's row order), and the
metrics are computed from the whole batch by the same formulas TRL applies to its gathered tensors.

By design per process (like TRL's own `step_time`): the timings (`thundersync/*_seconds`,
`thundersync/learner_idle_fraction`) and the rollout engine's own counters (`rollout/*`). The memory high-water marks
(`thundersync/stats_peak_mb`, `stats_bound_mb`, `buffered_peak`, `prefix_peak_mb`) are the maximum over processes —
the number that decides whether a run fits — and `thundersync/turn_fallbacks` the sum. TRL's `sampling/*` diagnostics
(how far the sampler's log-probs are from the learner's; `streaming/sampling_difference.py`) keep TRL's own reduction,
a mean of per-process means, so `sampling/sampling_logp_difference/mean` and `sampling/importance_sampling_ratio/mean`
depend on the number of processes as TRL's do; they are logged whenever the rollouts carry sampler log-probs, the
ratio's keys only with the vLLM importance-sampling correction. Not logged (TRL computes them in its loss forward,
which the streamed pass does not report): `entropy` (logged with the entropy bonus only) and `vespo/phi_seq_mean`.

Run the tests: `pytest tests/unit/trainers/grpo/test_grpo_metrics.py tests/integration/test_distributed_metrics.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...envs.harness.metrics import agent_metrics, length_metrics, model_token_counts, truncation_flags
from ...streaming.barrier import Collectives
from ...streaming.batch_metrics import reward_metrics, stats_bound_bytes
from ...streaming.loss_types import loss_type
from ...streaming.normalization import micro_batch_of
from ...streaming.sampling_difference import SamplingStats, merge, sampling_metrics
from ...types import AgentStats
from .settings import GRPOSettings

# One process's payload in, every process's payloads out, in rank order (`accelerate.utils.gather_object`).
GatherLogs = Callable[["ProcessBatchLog"], list["ProcessBatchLog"]]


@dataclass(frozen=True)
class MicroBatchCounts:
    """One TRL micro-batch of one process: the operands of TRL's `global_masked_mean` for `kl` and the clip ratios."""

    tokens: int  # loss tokens (Σ_t m_it over its rows)
    rows: int  # trajectories
    positive_tokens: int  # loss tokens of its rows with A_i > 0
    positive_rows: int  # its rows with A_i > 0
    kl_sum: float  # Σ_t m_it KL_it over its rows (0 when β = 0)


@dataclass(frozen=True)
class MetricSettings:
    """What decides which metrics a batch logs (built from the run's `GRPOSettings` by `metric_settings`)."""

    reward_names: tuple[str, ...]  # TRL's `reward_func_names`
    lengths: bool  # log the completion lengths (False: TRL's own generation logged them)
    release: str  # the release point in effect ('reward', 'content', 'turn')
    kl: bool  # β ≠ 0: TRL logs `kl`
    loss_type: str  # TRL's loss_type: which clip-ratio metrics TRL logs
    epsilon_high: float  # TRL's ε_high (cispo: the clip of the importance weight)
    sequence_level: bool  # importance_sampling_level == "sequence": TRL's masked means count rows, not tokens
    importance_sampling: bool = False  # TRL's vLLM importance-sampling correction is on: log its ratio's range


@dataclass(frozen=True)
class ProcessBatchLog:
    """What one process contributes to a logical batch's metrics and completions table (rows in index order)."""

    rewards_per_func: tuple[tuple[float, ...], ...]  # (B, K): per row, one value per function, NaN where it gave None
    rewards: tuple[float, ...]  # per row, the weighted nansum (NaN: unscorable), TRL's logged `reward`
    advantages: tuple[float, ...]  # per row, TRL's A_i (NaN → 0)
    prompt_tokens: tuple[int, ...]  # per row, prompt length (TRL's `num_tokens` counts it)
    model_tokens: tuple[int, ...]  # per row, completion tokens the model sampled (tool mask 1)
    truncated: tuple[bool, ...]  # per row, last token neither EOS nor pad
    zero_std_rows: int  # rows whose reward σ (group's or batch's) is close to 0: `frac_reward_zero_std`'s numerator
    micro_batches: tuple[MicroBatchCounts, ...]  # per TRL micro-batch of this process (`micro_batch_counts`)
    agent: tuple[AgentStats, ...]  # the agent loop's statistics of every agentic row (empty: not agentic)
    prompts: tuple[Any, ...]  # per row, the prompt as TRL logs it
    completions: tuple[Any, ...]  # per row, the decoded completion
    extra: Mapping[str, tuple[Any, ...]]  # `log_extra` column → one value per row (None where no call logged one)
    reported: Mapping[str, tuple[float, int]]  # `log_metric` name → (Σ values, number of values) on this process
    peak_stats_bytes: int  # high-water mark of this process's streamed statistics
    stats_bound_bytes: int  # this process's bound of the same
    peak_held: int  # most trajectories holding a release buffer at once
    turn_fallbacks: int  # turn-released trajectories recomputed whole
    peak_prefix_bytes: int = 0  # high-water mark of the open shared prefixes (0: shared_prefix off or refused)
    sampling: SamplingStats | None = None  # sampler-vs-learner log-probs over its rows (None: no row carries any)


def micro_batch_counts(scored_tokens: Sequence[int], advantages: Sequence[float], kl_sums: Sequence[float],
                       micro_batch_of: Mapping[int, int], micro_batches: int) -> tuple[MicroBatchCounts, ...]:
    """This process's `MicroBatchCounts` per TRL micro-batch (`micro_batch_of`: row → micro-batch, TRL's split)."""
    counts = [[0, 0, 0, 0, 0.0] for _ in range(micro_batches)]
    for row, (n, a, kl) in enumerate(zip(scored_tokens, advantages, kl_sums, strict=True)):
        c = counts[micro_batch_of[row]]
        c[0], c[1], c[4] = c[0] + n, c[1] + 1, c[4] + kl
        if a > 0:
            c[2], c[3] = c[2] + n, c[3] + 1
    return tuple(MicroBatchCounts(*c) for c in counts)


def micro_batch_metrics(logs: Sequence[ProcessBatchLog], settings: MetricSettings) -> dict[str, list[float]]:
    """TRL's `_compute_loss` metrics, one value per micro-batch, global over processes: `kl` (Σ KL / Σ tokens), and
    the clip ratios of the streamed pass, where θ = θ_k makes every importance ratio exactly 1 — so no token is low-
    or high-clipped (1 < 1 − ε_low and 1 > 1 + ε_high are false) and cispo's clipped tokens (ratio > ε_high, A > 0)
    are the positive-advantage ones exactly when ε_high < 1. `clip_ratio/low_min|high_max` are NaN, as TRL's
    nanmin/nanmax of per-row means, when no row of the micro-batch has a loss token."""
    out: dict[str, list[float]] = {}
    clip_metrics = loss_type(settings.loss_type).clip_metrics
    for b in range(len(logs[0].micro_batches)):
        parts = [log.micro_batches[b] for log in logs]
        tokens, rows = sum(c.tokens for c in parts), sum(c.rows for c in parts)
        if settings.kl:
            out.setdefault("kl", []).append(sum(c.kl_sum for c in parts) / max(tokens, 1))
        if clip_metrics == "clip_ratio":
            extreme = math.nan if tokens == 0 and not settings.sequence_level else 0.0
            for name, value in (("low_mean", 0.0), ("high_mean", 0.0), ("region_mean", 0.0), ("low_min", extreme),
                                ("high_max", extreme)):
                out.setdefault(f"clip_ratio/{name}", []).append(value)
        elif clip_metrics == "cispo":
            clipped, total = ((sum(c.positive_rows for c in parts), rows) if settings.sequence_level
                              else (sum(c.positive_tokens for c in parts), tokens))
            out.setdefault("cispo_clip_ratio", []).append(clipped / max(total, 1) if 1.0 > settings.epsilon_high
                                                          else 0.0)
    return out


def batch_metrics(logs: Sequence[ProcessBatchLog], settings: MetricSettings) -> dict[str, list[float]]:
    """Every metric of the batch from every process's payload (`logs`, rank order); lists, because TRL logs `kl`
    and the clip ratios once per micro-batch."""
    reward_names, release = settings.reward_names, settings.release
    rewards = [r for log in logs for r in log.rewards]
    per_func = torch.tensor([row for log in logs for row in log.rewards_per_func], dtype=torch.float32)
    per_func = per_func.reshape(len(rewards), len(reward_names))
    out = {name: [value] for name, value in reward_metrics(per_func, reward_names, rewards).items()}
    out["frac_reward_zero_std"] = [sum(log.zero_std_rows for log in logs) / len(rewards)]
    out.update(micro_batch_metrics(logs, settings))
    if all(log.sampling is not None for log in logs):
        sampled = sampling_metrics([log.sampling for log in logs], settings.importance_sampling)
        if not settings.importance_sampling:  # TRL logs sampling/* only with use_vllm and its correction on
            sampled = {f"thundersync/{name}": value for name, value in sampled.items()}
        out.update({name: [value] for name, value in sampled.items()})
    if settings.lengths:
        model_tokens = [n for log in logs for n in log.model_tokens]
        truncated = [t for log in logs for t in log.truncated]
        out.update({name: [value] for name, value in length_metrics(model_tokens, truncated).items()})
    out.update({name: [value] for name, value in agent_metrics([s for log in logs for s in log.agent]).items()})
    for name in sorted({name for log in logs for name in log.reported}):  # TRL: Σ values / Σ counts over processes
        total = sum(log.reported[name][0] for log in logs if name in log.reported)
        count = sum(log.reported[name][1] for log in logs if name in log.reported)
        if count:
            out[name] = [total / count]
    out["thundersync/stats_peak_mb"] = [max(log.peak_stats_bytes for log in logs) / 2**20]
    out["thundersync/stats_bound_mb"] = [max(log.stats_bound_bytes for log in logs) / 2**20]
    if release != "reward":
        out["thundersync/buffered_peak"] = [float(max(log.peak_held for log in logs))]
    if any(log.peak_prefix_bytes for log in logs):
        out["thundersync/prefix_peak_mb"] = [max(log.peak_prefix_bytes for log in logs) / 2**20]
    if release == "turn":
        out["thundersync/turn_fallbacks"] = [float(sum(log.turn_fallbacks for log in logs))]
    return out


def batch_tokens(logs: Sequence[ProcessBatchLog]) -> int:
    """Prompt + model tokens of the whole batch: what TRL adds to `state.num_input_tokens_seen` (`num_tokens`)."""
    return sum(sum(log.prompt_tokens) + sum(log.model_tokens) for log in logs)


def completions_table(logs: Sequence[ProcessBatchLog], reward_names: Sequence[str]) -> dict[str, Any]:
    """The batch's rows of TRL's completions table (`_logs`), every process's in rank order; a `log_extra` column
    some process did not log holds None on that process's rows, as TRL's gather leaves it."""
    rewards = {name: [row[i] for log in logs for row in log.rewards_per_func] for i, name in enumerate(reward_names)}
    extra = {}
    for column in sorted({column for log in logs for column in log.extra}):
        extra[column] = [v for log in logs for v in log.extra.get(column, (None,) * len(log.rewards))]
    return {
        "prompt": [p for log in logs for p in log.prompts],
        "completion": [c for log in logs for c in log.completions],
        "rewards": rewards,
        "advantages": [a for log in logs for a in log.advantages],
        "extra": extra,
    }


def gather_logs_of(accelerator: Any) -> GatherLogs:
    """Every process's payload through `accelerate.utils.gather_object` (one all-gather of pickled objects; with
    one process, the payload alone)."""
    from accelerate.utils import gather_object

    def gather(log: ProcessBatchLog) -> list[ProcessBatchLog]:
        return list(gather_object([log])) if accelerator.num_processes > 1 else [log]

    return gather


# -- the trainer side ---------------------------------------------------------------------------------------------
def process_batch_log(settings: GRPOSettings, totals, scored, advantages: Sequence[float], prompts: Sequence[Any],
                      zero_std_fraction: float, stats_bound: int, permutation: list[int],
                      extra_rows: Mapping[str, Mapping[int, Any]],
                      pending_metrics: Mapping[str, Sequence[float]]) -> ProcessBatchLog:
    """This process's `ProcessBatchLog` of the batch (`scored`: its sources in index order, `permutation`: TRL's
    shuffle of the batch). `extra_rows` (`log_extra` column → {trajectory: value}) and `pending_metrics`
    (`log_metric` name → values) are what the reward functions logged during the generation batch (TRL flushes them
    once per generation batch; the trainer clears them after this call)."""
    ids, masks = [s.rollout.completion_ids for s in scored], [s.rollout.env_mask for s in scored]
    spg = settings.args.steps_per_generation
    micro_batches = micro_batch_counts(totals.scored_tokens, advantages, totals.kl_sums,
                                       micro_batch_of(permutation, spg), spg)
    extra = {column: tuple(by_row.get(s.rollout.index) for s in scored) for column, by_row in extra_rows.items()}
    reported = {name: (float(sum(values)), len(values)) for name, values in pending_metrics.items() if values}
    sampled = [row for row in totals.sampling if row is not None]
    return ProcessBatchLog(
        rewards_per_func=tuple(tuple(s.rewards_per_func) for s in scored), rewards=tuple(s.reward for s in scored),
        advantages=tuple(advantages), prompt_tokens=tuple(len(s.rollout.prompt_ids) for s in scored),
        model_tokens=tuple(model_token_counts(ids, masks)),
        truncated=tuple(truncation_flags(ids, set(settings.eos_and_pad))),
        zero_std_rows=round(zero_std_fraction * len(scored)), micro_batches=micro_batches,
        agent=tuple(s.rollout.agent for s in scored if s.rollout.agent is not None), prompts=tuple(prompts),
        completions=tuple(s.rollout.completion for s in scored), extra=extra, reported=reported,
        peak_stats_bytes=totals.peak_stats_bytes, stats_bound_bytes=stats_bound, peak_held=totals.peak_held,
        turn_fallbacks=totals.turn_fallbacks, peak_prefix_bytes=totals.peak_prefix_bytes,
        sampling=merge(sampled) if sampled else None,
    )


def stats_bound(settings: GRPOSettings, totals, batch_size: int, num_reward_functions: int) -> int:
    """The memory bound of this batch's streamed statistics (`batch_metrics.stats_bound_bytes`)."""
    args = settings.args
    return stats_bound_bytes(
        totals, batch_size=batch_size, num_generations=settings.num_generations,
        max_open_groups=args.max_open_groups, release=settings.release, beta=settings.beta,
        max_buffered=args.max_buffered_trajectories, micro_batches=args.steps_per_generation,
        num_reward_functions=num_reward_functions, off_policy_mask=args.off_policy_mask_threshold is not None)


def router_aux_metric(values: Sequence[float], collectives: Collectives) -> list[float]:
    """TRL's `aux_loss` metric: one entry per micro-batch, each the mean over processes of that micro-batch's."""
    gathered = collectives.gather(torch.tensor(values, dtype=torch.float32))
    return gathered.view(-1, len(values)).mean(dim=0).tolist()


def metric_settings(settings: GRPOSettings, lengths: bool) -> MetricSettings:
    """The run's `MetricSettings`."""
    return MetricSettings(settings.reward_names, lengths, settings.release, settings.beta != 0.0,
                          settings.args.loss_type, float(settings.epsilon_high), settings.sequence_level,
                          importance_sampling=settings.correction is not None)


def record_batch(local: ProcessBatchLog, gather: GatherLogs, settings: MetricSettings,
                 metrics: Mapping[str, list], logs: Mapping[str, Any], tokens_seen: int) -> int:
    """Gather every process's payload and log the batch into TRL's `_metrics["train"]` (`metrics`) and `_logs`
    (`logs`); returns TRL's `state.num_input_tokens_seen` after the batch (`tokens_seen` before it). With TRL's own
    generation (`settings.lengths` False: `rollout_func`, `rollout_engine='trl'`), TRL already logged the lengths and
    counted the tokens."""
    gathered = gather(local)
    if settings.lengths:
        tokens_seen += batch_tokens(gathered)
    metrics["num_tokens"] = [tokens_seen]
    for name, values in batch_metrics(gathered, settings).items():
        metrics[name].extend(values)
    table = completions_table(gathered, settings.reward_names)
    logs["prompt"].extend(table["prompt"])
    logs["completion"].extend(table["completion"])
    for name, values in table["rewards"].items():
        logs["rewards"][name].extend(values)
    logs["advantages"].extend(table["advantages"])
    for column, values in table["extra"].items():
        logs["extra"][column].extend(values)
    return tokens_seen
