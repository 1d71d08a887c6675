"""The streaming core's records, built from a GRPO config: the core never reads TRL config objects, the trainers
build what it needs here (`LossNormalization`, `SamplingCorrection`, `PolicyValueRule`)."""

from __future__ import annotations

from typing import Any

from ..streaming.barrier import PolicyValueRule
from ..streaming.importance import SamplingCorrection
from ..streaming.loss_types import loss_type
from ..streaming.normalization import LossNormalization


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
