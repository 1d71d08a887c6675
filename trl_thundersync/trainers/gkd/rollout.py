"""Rollout-side wiring of `ThunderSyncGKDTrainer`: requests from a collated GKD batch or prompt rows, sampling
parameters, and the agent loop around the turn generator (`rollout_setup` builds it, `make_agent_engine` wraps it,
both as for GRPO). No training logic here."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...rollout.agent_engine import AgentRolloutEngine
from ...rollout.agent_setup import make_agent_engine
from ...rollout.engine import TurnGenerator
from ...types import RolloutRequest, SamplingParams
from ..lifecycle import trajectory_seed


def requests_from_collated(batch: Mapping[str, Any], run_seed: int, version: int, *, first_index: int = 0,
                           first_row: int | None = None) -> list[RolloutRequest]:
    """One request per row of a `DataCollatorForChatML` batch: the left-padded `prompts` without their padding.
    Rows are numbered from `first_index` (the micro-batch's offset in this process's share of the logical batch);
    the seed is that of row `first_row + i` of the global batch (`global_first_row`; default: `first_index`)."""
    prompts, mask = batch["prompts"], batch["prompt_attention_mask"]
    first_row = first_index if first_row is None else first_row
    return [
        RolloutRequest(index=first_index + i, group=first_index + i,
                       prompt_ids=tuple(prompts[i][mask[i].bool()].tolist()),
                       seed=trajectory_seed(run_seed, version, first_row + i))
        for i in range(prompts.shape[0])
    ]


def requests_from_rows(rows: Sequence[Mapping[str, Any]], run_seed: int, version: int, *, first_index: int = 0,
                       first_row: int | None = None) -> list[RolloutRequest]:
    """One request per prompt row (agentic datasets: `prompt` messages plus environment reset columns), numbered
    from `first_index`, seeded as row `first_row + i` of the global batch (default: `first_index`)."""
    first_row = first_index if first_row is None else first_row
    return [
        RolloutRequest(index=first_index + i, group=first_index + i, prompt_ids=(),
                       seed=trajectory_seed(run_seed, version, first_row + i), prompt=row["prompt"], row=row)
        for i, row in enumerate(rows)
    ]


def global_first_row(micro_step: int, rows: int, process_index: int, num_processes: int) -> int:
    """Row of the global logical batch that this process's micro-batch `micro_step` (of `rows` rows) starts at.

    Accelerate's sharded dataloader hands process r the r-th of every `num_processes` consecutive batches, so
    micro-step m of the global batch is the processes' batches side by side: process r's row i is global row
    (m · num_processes + r) · rows + i — the row (and the seed) one process with `num_processes · rows` rows per
    micro-batch gives the same dataset row."""
    return (micro_step * num_processes + process_index) * rows


def sampling_params(args, eos_token_ids: Sequence[int], pad_token_id: int | None,
                    max_new_tokens: int) -> SamplingParams:
    """TRL GKD's generation settings: temperature sampling, top_k=0, top_p=1."""
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=args.temperature, top_p=1.0, top_k=0,
                          eos_token_ids=tuple(eos_token_ids), pad_token_id=pad_token_id)


def agent_engine(generator: TurnGenerator, args, *, tokenizer, tools: Sequence[Callable] | None, environment_factory,
                 on_turn: Callable | None, policy: Any = None) -> AgentRolloutEngine:
    """The multi-turn agent engine over any `TurnGenerator` (`make_agent_engine`, as for GRPO), emitting turn events
    to `on_turn`; its context budget is capped by the windows of `policy` and of the generator's servers."""
    return make_agent_engine(generator, processing_class=tokenizer, limits=args.agent_limits(), tools=tools or (),
                             environment_factory=environment_factory,
                             chat_template_kwargs=getattr(args, "chat_template_kwargs", None),
                             on_turn=on_turn, policy=policy,
                             max_concurrent=max(8, args.per_device_train_batch_size * args.gradient_accumulation_steps))


def pass_through_collator(rows: list[dict]) -> list[dict]:
    """Agentic prompt datasets: rows reach `training_step` as they are (the agent loop renders them)."""
    return rows
