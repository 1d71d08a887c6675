"""Rollout-side wiring of `ThunderSyncGKDTrainer`: requests from a collated GKD batch or prompt rows, sampling
parameters, and the agent loop around the turn generator (`rollout_setup` builds it, `make_agent_engine` wraps it,
both as for GRPO). No training logic here."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..rollout.agent_engine import AgentRolloutEngine
from ..rollout.agent_setup import make_agent_engine
from ..rollout.engine import TurnGenerator
from ..types import RolloutRequest, SamplingParams
from .lifecycle import trajectory_seed


def requests_from_collated(batch: Mapping[str, Any], run_seed: int, version: int, *,
                           first_index: int = 0) -> list[RolloutRequest]:
    """One request per row of a `DataCollatorForChatML` batch: the left-padded `prompts` without their padding.
    Rows are numbered from `first_index` (the micro-batch's offset in the logical batch); the index sets the seed."""
    prompts, mask = batch["prompts"], batch["prompt_attention_mask"]
    return [
        RolloutRequest(index=first_index + i, group=first_index + i,
                       prompt_ids=tuple(prompts[i][mask[i].bool()].tolist()),
                       seed=trajectory_seed(run_seed, version, first_index + i))
        for i in range(prompts.shape[0])
    ]


def requests_from_rows(rows: Sequence[Mapping[str, Any]], run_seed: int, version: int, *,
                       first_index: int = 0) -> list[RolloutRequest]:
    """One request per prompt row (agentic datasets: `prompt` messages plus environment reset columns), numbered
    from `first_index`."""
    return [
        RolloutRequest(index=first_index + i, group=first_index + i, prompt_ids=(),
                       seed=trajectory_seed(run_seed, version, first_index + i), prompt=row["prompt"], row=row)
        for i, row in enumerate(rows)
    ]


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
