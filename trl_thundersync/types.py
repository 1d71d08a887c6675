"""Frozen records passed between the rollout side and the learner.

A *logical batch* is TRL's generation batch: `B` trajectories in `B / num_generations` groups, all sampled at one
policy version, consumed by exactly one optimizer step.

The `Literal` aliases below are the string options and outcomes that cross modules (config fields, the learner,
agent statistics); each is defined once, and every tuple of allowed values is `typing.get_args` of its alias.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

# When learner work runs: each trajectory as soon as it is ready, or the whole batch after it closed (the paper's Sync).
Schedule = Literal["thundersync", "sync"]
# When a trajectory's backward runs under schedule="thundersync" (streaming/release.py).
ReleasePoint = Literal["reward", "content", "turn"]
# How a turn's backward runs (streaming/turn_grpo.py, distillation): "boundary_cut" forwards only the turn's new tokens
# (linear, no activation checkpointing); "naive" re-runs the turn's whole context (quadratic).
TurnBackward = Literal["boundary_cut", "naive"]
# How reward functions are called (streaming/reward_scope.py).
RewardScope = Literal["auto", "trajectory", "group", "batch"]
# What an episode with tools / environment_factory is: TRL 1.16's tool loop, or the ThunderSync paper's protocol.
AgentProtocol = Literal["trl", "paper"]
# Why an episode ended, per protocol (envs/harness/agent_loop.py and envs/harness/trl_tool_loop.py).
PaperStopReason = Literal["answered", "finished", "max_turns", "max_completion_tokens", "max_context_tokens",
                          "turn_token_limit"]
TRLStopReason = Literal["answered", "max_tool_calling_iterations", "max_completion_length", "max_context_tokens"]
StopReason = Literal[PaperStopReason, TRLStopReason]


@dataclass(frozen=True)
class SamplingParams:
    """How the rollout engine samples; mirrors the GRPOConfig generation fields."""

    max_new_tokens: int  # GRPOConfig.max_completion_length
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = disabled
    min_p: float = 0.0  # 0 = disabled
    repetition_penalty: float = 1.0
    eos_token_ids: tuple[int, ...] = ()  # generation stops after any of these
    pad_token_id: int | None = None


@dataclass(frozen=True)
class RolloutRequest:
    """One trajectory to generate. The seed makes the sample independent of arrival order and schedule."""

    index: int  # position in the logical batch, 0..B-1
    group: int  # index // num_generations
    prompt_ids: tuple[int, ...]  # already chat-templated token ids
    seed: int  # per-trajectory sampling seed
    prompt: Any = None  # the raw prompt (text or messages), for engines that apply the chat template themselves
    row: Mapping[str, Any] | None = None  # the dataset row (environment reset kwargs), for agent engines


@dataclass(frozen=True)
class AgentStats:
    """How one multi-turn trajectory went (for metrics; the learner never reads it)."""

    turns: int  # generation turns taken
    tool_calls: int  # tool calls executed
    tool_failures: int  # calls that raised, timed out, named an unknown tool, or failed to parse
    parse_errors: int  # turns whose tool call could not be parsed (TRL protocol: such a turn ends the episode)
    observation_truncations: int  # observations cut to head + tail
    tool_intervals: tuple[tuple[float, float], ...]  # (start, end) perf_counter of every executed tool call
    turn_intervals: tuple[tuple[float, float], ...]  # (request sent, action complete) of every generation turn
    wall_seconds: float  # reset to last token
    stop_reason: StopReason  # a PaperStopReason or a TRLStopReason, by protocol
    protocol: AgentProtocol = "paper"  # the agent_protocol that produced it ("paper" counts parse errors as failures)

    @property
    def tool_seconds(self) -> tuple[float, ...]:
        return tuple(end - start for start, end in self.tool_intervals)


@dataclass(frozen=True)
class TurnEvent:
    """Emitted when a turn's action tokens are complete (the per-turn release point of on-policy distillation and
    of GRPO's per-turn score gradients)."""

    index: int  # trajectory index in the batch
    turn: int  # 0-based turn number
    policy_version: int  # version that sampled the action
    context_ids: tuple[int, ...]  # everything the action was conditioned on (prompt, earlier turns, observations)
    action_ids: tuple[int, ...]  # the turn's generated tokens (all scored)
    time: float  # perf_counter when the action was complete
    action_logprobs: tuple[float, ...] | None = None  # the sampler's log-prob of each action token; None: unknown


@dataclass(frozen=True)
class Rollout:
    """A finished trajectory, tokens in and tokens out, as produced by a rollout engine."""

    index: int  # position in the logical batch (row of the generation batch)
    group: int  # GRPO group id within the batch
    policy_version: int  # version of θ that sampled every token (checked by the learner)
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]  # generated tokens (and, multi-turn, interleaved tool tokens)
    env_mask: tuple[int, ...] | None = None  # 1 = model token (scored), 0 = tool/environment token; None = all 1
    sampling_logprobs: tuple[float, ...] | None = None  # log-probs reported by the sampler, per completion token
    completion: Any = None  # decoded completion handed to reward functions (str or list of messages)
    extra_fields: Mapping[str, Any] = field(default_factory=dict)  # rollout_func extras forwarded to rewards
    started_at: float = 0.0  # time.perf_counter() when generation of this trajectory started
    finished_at: float = 0.0  # time.perf_counter() when the last token was produced
    truncated: bool | None = None  # ended by a limit (None: infer from the last token, as TRL does)
    agent: AgentStats | None = None  # multi-turn statistics, for agentic rollouts

    def __post_init__(self) -> None:
        if self.env_mask is not None and len(self.env_mask) != len(self.completion_ids):
            raise ValueError(
                f"trajectory {self.index}: env_mask has {len(self.env_mask)} entries for "
                f"{len(self.completion_ids)} completion tokens"
            )


@dataclass(frozen=True)
class ScoredRollout:
    """A rollout with its rewards: the unit of GRPO learner work (an objective source)."""

    rollout: Rollout
    rewards_per_func: tuple[float, ...]  # one value per reward function, NaN where it returned None
    reward: float  # weighted nansum of rewards_per_func; NaN when every function returned None (unscorable)
    scored_at: float  # time.perf_counter() when the reward became known: the source's ready time τ

    @property
    def scorable(self) -> bool:
        return not math.isnan(self.reward)
