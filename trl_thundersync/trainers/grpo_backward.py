"""The per-source backward passes of one GRPO logical batch, built from a trainer's settings.

`trajectory_backward`: one forward + backward per finished trajectory (release at the reward or at content
readiness), through TRL's own `_get_per_token_logps_and_entropies`. `turn_backward`: the per-turn boundary-cut
backward of `release="turn"`, with the same normalization, masking, KL and importance-sampling settings. Both run on
the unwrapped module: DDP's reducer must not see per-source passes (the barrier averages the batch direction once).
"""

from __future__ import annotations

from typing import Any

from trl.trainer.grpo_trainer import use_adapter

from ..streaming.importance import SamplingCorrection
from ..streaming.normalization import LossNormalization
from ..streaming.source import TrajectoryBackward
from ..streaming.turn_grpo import TurnScoreBackward


def trajectory_backward(trainer: Any, module: Any, normalization: LossNormalization) -> TrajectoryBackward:
    def logps(ids, mask, keep):
        return trainer._get_per_token_logps_and_entropies(module, ids, mask, keep)[0]

    return TrajectoryBackward(
        params=trainer._trainable, logps_fn=logps,
        ref_logps_fn=(lambda ids, mask, keep: reference_logps(trainer, ids, mask, keep)) if trainer.beta else None,
        normalization=normalization, eos_and_pad=[*trainer.eos_token_ids, trainer._tokenizer.pad_token_id],
        mask_truncated=trainer.mask_truncated_completions, beta=trainer.beta,
        bias_correction_kl=trainer.args.use_bias_correction_kl, device=trainer.accelerator.device,
        correction=SamplingCorrection.from_config(trainer.args),
    )


def reference_logps(trainer: Any, ids, mask, keep):
    """TRL's reference log-probs: the reference model, or (PEFT) the policy with its adapter disabled / 'ref'."""
    if trainer.ref_model is not None:
        return trainer._get_per_token_logps_and_entropies(trainer.ref_model, ids, mask, keep)[0]
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    with use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None):
        return trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep)[0]


def turn_backward(trainer: Any, module: Any, normalization: LossNormalization) -> TurnScoreBackward:
    ref_model, ref_context = None, None
    if trainer.beta != 0.0:
        if trainer.ref_model is not None:
            ref_model = trainer.accelerator.unwrap_model(trainer.ref_model)
        else:  # PEFT: the reference is the policy with its adapter disabled (or the 'ref' adapter)
            ref_model = module
            name = "ref" if "ref" in module.peft_config else None

            def ref_context():
                return use_adapter(module, adapter_name=name)
    return TurnScoreBackward(
        model=module, params=trainer._trainable, normalization=normalization,
        eos_and_pad=[*trainer.eos_token_ids, trainer._tokenizer.pad_token_id],
        mask_truncated=trainer.mask_truncated_completions, temperature=trainer.args.temperature, beta=trainer.beta,
        ref_model=ref_model, ref_context=ref_context, bias_correction_kl=trainer.args.use_bias_correction_kl,
        correction=SamplingCorrection.from_config(trainer.args), device=trainer.accelerator.device,
        policy_version=trainer.policy_version, autocast=trainer.accelerator.autocast,
    )
