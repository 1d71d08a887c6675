"""The per-source backward passes of one GRPO logical batch, built from a trainer's settings.

`trajectory_backward`: one forward + backward per finished trajectory (release at the reward or at content
readiness), through TRL's own `_get_per_token_logps_and_entropies`. `turn_backward`: the per-turn boundary-cut
backward of `release="turn"`, with the same normalization, masking, KL and importance-sampling settings.
`router_aux_backward`: the MoE load-balancing term of one whole TRL micro-batch (`streaming/moe_aux.py`). All run on
the unwrapped module: DDP's reducer must not see per-source passes (the barrier averages the batch direction once).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from trl.trainer.grpo_trainer import use_adapter

from ..streaming.moe_aux import ChunkBackward, RouterAuxLoss, padded_micro_batch
from ..streaming.normalization import LossNormalization
from ..streaming.source import TrajectoryBackward, flatten_grads, loss_mask
from ..streaming.turn_grpo import TurnScoreBackward
from .grpo_settings import sampling_correction


def trajectory_backward(trainer: Any, module: Any, normalization: LossNormalization,
                        entropy_coef: float | None = None) -> TrajectoryBackward:
    """`entropy_coef`: the entropy bonus coefficient applied to this batch (None: TRL adds no bonus)."""
    def logps(ids, mask, keep):
        return trainer._get_per_token_logps_and_entropies(module, ids, mask, keep)[0]

    def logps_and_entropies(ids, mask, keep):
        logps, entropies, _ = trainer._get_per_token_logps_and_entropies(module, ids, mask, keep,
                                                                         compute_entropy=True)
        return logps, entropies

    return TrajectoryBackward(
        params=trainer._trainable, logps_fn=logps,
        ref_logps_fn=reference_logps_fn(trainer, module) if trainer.beta else None,
        normalization=normalization, eos_and_pad=[*trainer.eos_token_ids, trainer._tokenizer.pad_token_id],
        mask_truncated=trainer.mask_truncated_completions, beta=trainer.beta,
        bias_correction_kl=trainer.args.use_bias_correction_kl, device=trainer.accelerator.device,
        correction=sampling_correction(trainer.args),
        logps_entropy_fn=logps_and_entropies if entropy_coef is not None else None, entropy_coef=entropy_coef,
        off_policy_sampling=off_policy_sampling(trainer),
        sequence_level_kl=trainer.importance_sampling_level == "sequence",
    )


def off_policy_sampling(trainer: Any) -> bool:
    """Whether TRL's off-policy mask compares with sampler log-probs: TRL has them from vLLM (use_vllm) or from a
    `rollout_func` / its own generation's output; with local transformers generation it compares the policy with
    itself (KL 0, nothing is ever masked)."""
    if trainer.args.off_policy_mask_threshold is None:
        return False
    return trainer.args.samples_from_vllm() or trainer._uses_trl_generation()


def reference_logps_fn(trainer: Any, module: Any):
    """TRL's reference log-probs: the reference model, or (PEFT) the policy with its adapter disabled / 'ref'. Both
    as the placement hands them out (`module`, `reference_module`), never an engine-wrapped model, whose forward may
    be a collective (FSDP2's all-gather, DDP's buffer broadcast) that the other processes do not enter at this
    source's time. Resolved here, at the batch start (on every process together)."""
    if trainer.ref_model is not None:
        reference = trainer._learner_placement().reference_module(trainer.ref_model)
        return lambda ids, mask, keep: trainer._get_per_token_logps_and_entropies(reference, ids, mask, keep)[0]

    def peft_reference(ids, mask, keep):
        with use_adapter(module, adapter_name="ref" if "ref" in module.peft_config else None):
            return trainer._get_per_token_logps_and_entropies(module, ids, mask, keep)[0]

    return peft_reference


def turn_backward(trainer: Any, module: Any, normalization: LossNormalization,
                  entropy_coef: float | None = None) -> TurnScoreBackward:
    ref_model, ref_context = None, None
    if trainer.beta != 0.0:
        if trainer.ref_model is not None:
            ref_model = trainer._learner_placement().reference_module(trainer.accelerator.unwrap_model(
                trainer.ref_model))
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
        correction=sampling_correction(trainer.args), device=trainer.accelerator.device,
        policy_version=trainer.policy_version, autocast=trainer.accelerator.autocast, entropy_coef=entropy_coef,
        off_policy_sampling=off_policy_sampling(trainer),
    )


def router_aux_loss(trainer: Any, module: Any, permutation: list[int]) -> RouterAuxLoss | None:
    """TRL's MoE router auxiliary term for one generation batch (None when TRL would not add it)."""
    if not trainer.aux_loss_enabled:
        return None
    # TRL divides the term by `current_gradient_accumulation_steps` (= steps_per_generation, which ThunderSync requires)
    scale = trainer.router_aux_loss_coef / trainer.current_gradient_accumulation_steps
    return RouterAuxLoss(
        permutation=permutation, micro_batches=trainer.args.steps_per_generation, scale=scale,
        chunk_backward=router_aux_backward(trainer, module),
        num_params=sum(p.numel() for p in trainer._trainable), device=trainer.accelerator.device,
    )


def router_aux_backward(trainer: Any, module: Any) -> ChunkBackward:
    """∇(scale · aux_b) of one micro-batch, with TRL's own forward (`compute_aux_loss=True`) over TRL's tensors."""
    eos_and_pad = [*trainer.eos_token_ids, trainer._tokenizer.pad_token_id]

    def attended(rollout) -> list[int]:
        # TRL's completion_mask: every completion token (tool tokens too), all 0 for a masked truncated completion;
        # the truncation rule is loss_mask's (the one the policy term uses), applied without the env mask
        whole = replace(rollout, env_mask=None)
        return loss_mask(whole, eos_and_pad, trainer.mask_truncated_completions).int().tolist()

    def backward(rollouts, scale: float) -> tuple[torch.Tensor, float]:
        ids, mask, keep = padded_micro_batch(rollouts, trainer._tokenizer.pad_token_id, attended,
                                             trainer.args.pad_to_multiple_of, trainer.accelerator.device)
        _, _, aux = trainer._get_per_token_logps_and_entropies(module, ids, mask, keep, compute_aux_loss=True)
        if not aux.requires_grad:  # no trainable parameter reaches the routers (e.g. an adapter elsewhere)
            return torch.zeros(sum(p.numel() for p in trainer._trainable), device=ids.device), float(aux)
        grads = torch.autograd.grad(scale * aux, trainer._trainable, allow_unused=True)
        return flatten_grads(grads, trainer._trainable), float(aux.detach())

    return backward
