"""Frozen records passed between the rollout side and the learner.

A *logical batch* is TRL's generation batch: `B` trajectories in `B / num_generations` groups, all sampled at one
policy version, consumed by exactly one optimizer step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


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
