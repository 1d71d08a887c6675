"""The streaming core's records, built from a GRPO config: the core never reads TRL config objects, the trainers
build what it needs here (`LossNormalization`, `SamplingCorrection`, `PolicyValueRule`), and the GRPO trainer's
helpers read one frozen `GRPOSettings`, built once in the trainer's `__init__`, instead of the trainer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...streaming.barrier import PolicyValueRule
from ...streaming.importance import SamplingCorrection
from ...streaming.loss_types import loss_type
from ...streaming.normalization import LossNormalization


def loss_normalization(args: Any, batch_size: int, num_processes: int = 1) -> LossNormalization:
    """The normalization of `args.loss_type` for a local generation batch of `batch_size` trajectories.

    cispo's policy coefficient is TRL's detached clamp min(1, ε_high), ε_high = `epsilon_high`, or `epsilon` when
    that is None (TRL's trainer falls back the same way)."""
    epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon  # as GRPOTrainer
    clamped = loss_type(args.loss_type).policy_coefficient == "epsilon_high_clamp"
    coefficient = min(1.0, epsilon_high) if clamped else 1.0
    return LossNormalization(args.loss_type, batch_size, args.steps_per_generation, args.max_completion_length,
                             coefficient, num_processes)


def sampling_correction(args: Any) -> SamplingCorrection | None:
    """The vLLM importance-sampling correction TRL would apply for this config, or None when it applies none."""
    if not (args.samples_from_vllm() and args.vllm_importance_sampling_correction):
        return None
    return SamplingCorrection(args.vllm_importance_sampling_mode, args.vllm_importance_sampling_clip_min,
                              args.vllm_importance_sampling_clip_max)


def policy_value_rule(args: Any) -> PolicyValueRule:
    """sapo's gate temperatures for the loss value (`barrier.policy_loss_terms`); nothing for the other losses."""
    if loss_type(args.loss_type).value_gate != "sapo":
        return PolicyValueRule()
    return PolicyValueRule(sapo_temperatures=(args.sapo_temperature_pos, args.sapo_temperature_neg))


@dataclass(frozen=True)
class EntropySettings:
    """TRL's entropy bonus (`entropy_coef`, `use_adaptive_entropy`); the coefficient itself is TRL's trainer state."""

    enabled: bool  # TRL's `_entropy_bonus_enabled`: the bonus is added at all
    adaptive: bool  # `use_adaptive_entropy`: the coefficient moves once per optimizer step
    target: float  # `entropy_target`
    delta: float  # `entropy_coef_delta`
    minimum: float  # `entropy_coef_min`
    maximum: float  # `entropy_coef_max`

    @classmethod
    def of(cls, args: Any, enabled: bool, adaptive: bool) -> EntropySettings:
        """From the config and TRL's `_entropy_bonus_enabled`, `use_adaptive_entropy`."""
        return cls(bool(enabled), bool(adaptive), args.entropy_target, args.entropy_coef_delta, args.entropy_coef_min,
                   args.entropy_coef_max)


@dataclass(frozen=True)
class GRPOSettings:
    """Everything the GRPO trainer's helpers read, fixed for the run (built by the trainer's `__init__`)."""

    args: Any  # the ThunderSyncGRPOConfig (its `loss_normalization`, `sampling_correction`, rollout fields)
    num_processes: int  # W
    device: torch.device  # the accelerator's device
    beta: float  # TRL's β (KL coefficient)
    epsilon_high: float  # TRL's resolved ε_high
    sequence_level: bool  # importance_sampling_level == "sequence"
    mask_truncated: bool  # TRL's `mask_truncated_completions`
    eos_and_pad: tuple[int, ...]  # TRL's eos token ids, then the pad token id
    pad_token_id: int  # the tokenizer's pad token id
    pad_to_multiple_of: int | None  # TRL's `pad_to_multiple_of`
    num_generations: int  # G
    scale_rewards: str  # TRL's normalized `scale_rewards`
    release: str  # the release point in effect ('reward', 'content', 'turn')
    uses_trl_generation: bool  # rollout_func or rollout_engine='trl': TRL's own generation samples
    agentic: bool  # tools / environment_factory: the agent loop samples
    off_policy_sampling: bool  # TRL's off-policy mask compares with the sampler's log-probs
    objective_weights: tuple[float, ...] | None  # normalize_then_sum's reward weights (None: sum_then_normalize)
    router_aux_coef: float | None  # TRL's router_aux_loss_coef when it adds the MoE term (None: it adds none)
    reward_names: tuple[str, ...]  # TRL's `reward_func_names`
    entropy: EntropySettings  # the entropy bonus

    def normalization(self, batch_size: int) -> LossNormalization:
        """The loss normalization of a local generation batch of `batch_size` trajectories."""
        return loss_normalization(self.args, batch_size, self.num_processes)

    @property
    def correction(self) -> SamplingCorrection | None:
        """The vLLM importance-sampling correction (`sampling_correction`)."""
        return sampling_correction(self.args)

    @property
    def value_rule(self) -> PolicyValueRule:
        """sapo's gate for the loss value (`policy_value_rule`)."""
        return policy_value_rule(self.args)


def release_in_effect(args: Any, agentic: bool, beta: float, sequence_level: bool) -> str:
    """The release point in effect: 'turn' needs turn events, which only multi-turn agent engines emit."""
    if args.release == "turn" and not agentic:
        return "content"
    if args.release == "turn" and beta != 0.0 and args.use_bias_correction_kl and sequence_level:
        return "content"  # the sequence-level KL ratio spreads the whole row's KL over its tokens: not per turn
    return args.release


def off_policy_sampling(args: Any, uses_trl_generation: bool) -> bool:
    """Whether TRL's off-policy mask compares with sampler log-probs: TRL has them from vLLM (use_vllm) or from a
    `rollout_func` / its own generation's output; with local transformers generation it compares the policy with
    itself (KL 0, nothing is ever masked)."""
    if args.off_policy_mask_threshold is None:
        return False
    return args.samples_from_vllm() or uses_trl_generation


def objective_weights(args: Any, reward_weights: torch.Tensor) -> tuple[float, ...] | None:
    """normalize_then_sum: the reward weights its per-function group statistics use (None: sum_then_normalize)."""
    if args.multi_objective_aggregation != "normalize_then_sum":
        return None
    return tuple(float(w) for w in reward_weights.tolist())
