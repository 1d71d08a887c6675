"""The per-source backward passes of one GRPO logical batch, built from the trainer's `GRPOSettings` and the batch's
`BatchModels` (the modules and TRL's log-prob function, passed explicitly).

`trajectory_backward`: one forward + backward per finished trajectory (release at the reward or at content
readiness), through TRL's own `_get_per_token_logps_and_entropies`. `turn_backward`: the per-turn boundary-cut
backward of `release="turn"`, with the same normalization, masking, KL and importance-sampling settings.
`router_aux_backward`: the MoE load-balancing term of one whole TRL micro-batch (`streaming/moe_aux.py`). All run on
the unwrapped module: DDP's reducer must not see per-source passes (the barrier averages the batch direction once).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
from trl.trainer.grpo_trainer import use_adapter

from ...streaming.moe_aux import ChunkBackward, RouterAuxLoss, padded_micro_batch
from ...streaming.normalization import LossNormalization
from ...streaming.prefix_groups import PrefixGroups, log_once
from ...streaming.shared_prefix import model_refusal, pass_flop_counter
from ...streaming.source import TrajectoryBackward, flatten_grads, loss_mask
from ...streaming.source_batch import GroupBackward, group_batch
from ...streaming.turn_grpo import TurnScoreBackward
from ..placement.replicated import ReplicatedPlacement
from .settings import GRPOSettings

# TRL's `GRPOTrainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, ...)`
ModelLogProbs = Callable[..., tuple[Any, Any, Any]]


@dataclass(frozen=True)
class BatchModels:
    """What one batch's per-source passes run on, resolved at the batch start (on every process together)."""

    module: torch.nn.Module  # the placement's policy module (no DDP/engine hooks)
    params: list[torch.Tensor]  # its trainable parameters, in the order of every streamed P-vector
    forward: ModelLogProbs  # TRL's per-token log-probs (and entropies, aux loss) of a model
    reference: torch.nn.Module | None  # the placement's reference model (None: β = 0, or PEFT: the policy without
    #   its adapter)
    turn_reference: torch.nn.Module | None  # the same from the unwrapped reference model (turn-level passes)
    autocast: Callable[[], Any]  # the accelerator's autocast context (turn-level passes)
    policy_version: int  # θ_k's version


def trajectory_backward(settings: GRPOSettings, models: BatchModels, normalization: LossNormalization,
                        entropy_coef: float | None = None, prefixes: PrefixGroups | None = None) -> TrajectoryBackward:
    """`entropy_coef`: the entropy bonus coefficient applied to this batch (None: TRL adds no bonus); `prefixes`:
    the batch's shared prefixes (None: full passes)."""
    forward, module = models.forward, models.module

    def logps(ids, mask, keep):
        return forward(module, ids, mask, keep)[0]

    def logps_and_entropies(ids, mask, keep):
        logps, entropies, _ = forward(module, ids, mask, keep, compute_entropy=True)
        return logps, entropies

    return TrajectoryBackward(
        params=models.params, logps_fn=logps,
        ref_logps_fn=reference_logps_fn(models) if settings.beta else None,
        normalization=normalization, eos_and_pad=list(settings.eos_and_pad),
        mask_truncated=settings.mask_truncated, beta=settings.beta,
        bias_correction_kl=settings.args.use_bias_correction_kl, device=settings.device,
        correction=settings.correction,
        logps_entropy_fn=logps_and_entropies if entropy_coef is not None else None, entropy_coef=entropy_coef,
        off_policy_sampling=settings.off_policy_sampling, sequence_level_kl=settings.sequence_level,
        prefixes=prefixes, temperature=settings.args.temperature,
    )


def group_backward(settings: GRPOSettings, backward: TrajectoryBackward, placement: Any) -> GroupBackward | None:
    """A group's last members, ready together, in one padded pass (`streaming/source_batch.py`), or None: off
    (`batch_group_members=False`), `num_iterations > 1` (passes 2..μ replay each member's recorded θ_k log-probs), or
    a sharded placement (each per-source pass is a collective every process enters with one source)."""
    args = settings.args
    if not args.batch_group_members or args.num_iterations > 1 or not isinstance(placement, ReplicatedPlacement):
        return None
    return partial(group_batch, backward, max_tokens=args.batch_group_max_tokens)


def prefix_refusal(settings: GRPOSettings, module: torch.nn.Module, sharded: bool) -> str | None:
    """Why this run's batches cannot use shared prefixes exactly (None: they can)."""
    args = settings.args
    refusals = [
        (sharded, "a sharded or engine-managed placement (DeepSpeed, FSDP2)"),
        (args.num_iterations > 1, "num_iterations > 1 (passes 2..μ re-run full forwards)"),
        (args.off_policy_mask_threshold is not None, "the off-policy mask holds score gradients per trajectory"),
        (settings.objective_weights is not None, "multi_objective_aggregation='normalize_then_sum'"),
    ]
    for refused, reason in refusals:
        if refused:
            return reason
    return model_refusal(module)


def prefix_groups(settings: GRPOSettings, models: BatchModels, max_open: int, placement: Any) -> PrefixGroups | None:
    """The batch's shared prefixes (`streaming/prefix_groups.py`), or None: `shared_prefix` is off, or a reason to
    refuse it (logged once); `placement` the learner placement (only a replicated one, single process or DDP, runs
    the per-source passes on the whole model)."""
    if not settings.args.shared_prefix:
        return None
    reason = prefix_refusal(settings, models.module, not isinstance(placement, ReplicatedPlacement))
    if reason is not None:
        log_once(reason)
        return None
    module, reference, context = models.module, None, None
    if settings.beta != 0.0:
        reference = models.reference if models.reference is not None else module
        if models.reference is None:  # PEFT: the policy with its adapter disabled (or the 'ref' adapter)
            name = "ref" if "ref" in module.peft_config else None

            def context():
                return use_adapter(module, adapter_name=name)
    return PrefixGroups(model=module, params=models.params, group_size=settings.num_generations, max_open=max_open,
                        temperature=settings.args.temperature, device=settings.device, reference=reference,
                        reference_context=context, flops=pass_flop_counter(module, models.params),
                        min_prompt_tokens=settings.args.shared_prefix_min_prompt_tokens)


def reference_logps_fn(models: BatchModels):
    """TRL's reference log-probs: the reference model, or (PEFT) the policy with its adapter disabled / 'ref'. Both
    as the placement hands them out (`module`, `reference`), never an engine-wrapped model, whose forward may be a
    collective (FSDP2's all-gather, DDP's buffer broadcast) that the other processes do not enter at this source's
    time."""
    forward, module, reference = models.forward, models.module, models.reference
    if reference is not None:
        return lambda ids, mask, keep: forward(reference, ids, mask, keep)[0]

    def peft_reference(ids, mask, keep):
        with use_adapter(module, adapter_name="ref" if "ref" in module.peft_config else None):
            return forward(module, ids, mask, keep)[0]

    return peft_reference


def turn_backward(settings: GRPOSettings, models: BatchModels, normalization: LossNormalization,
                  entropy_coef: float | None = None, prefixes: PrefixGroups | None = None) -> TurnScoreBackward:
    """The per-turn boundary-cut backward of `release="turn"`; with `prefixes`, each member's turns start from its
    group's shared prefix."""
    module, ref_model, ref_context = models.module, None, None
    if settings.beta != 0.0:
        if models.turn_reference is not None:
            ref_model = models.turn_reference
        else:  # PEFT: the reference is the policy with its adapter disabled (or the 'ref' adapter)
            ref_model = module
            name = "ref" if "ref" in module.peft_config else None

            def ref_context():
                return use_adapter(module, adapter_name=name)
    return TurnScoreBackward(
        model=module, params=models.params, normalization=normalization, eos_and_pad=list(settings.eos_and_pad),
        mask_truncated=settings.mask_truncated, temperature=settings.args.temperature, beta=settings.beta,
        ref_model=ref_model, ref_context=ref_context, bias_correction_kl=settings.args.use_bias_correction_kl,
        correction=settings.correction, device=settings.device, policy_version=models.policy_version,
        autocast=models.autocast, entropy_coef=entropy_coef, off_policy_sampling=settings.off_policy_sampling,
        prefixes=prefixes, flops=pass_flop_counter(module, models.params),
    )


def router_aux_loss(settings: GRPOSettings, models: BatchModels, permutation: list[int],
                    accumulation_steps: int) -> RouterAuxLoss | None:
    """TRL's MoE router auxiliary term for one generation batch (None when TRL would not add it);
    `accumulation_steps`: TRL's `current_gradient_accumulation_steps`, which TRL divides the term by."""
    if settings.router_aux_coef is None:
        return None
    # = steps_per_generation, which ThunderSync requires
    scale = settings.router_aux_coef / accumulation_steps
    return RouterAuxLoss(
        permutation=permutation, micro_batches=settings.args.steps_per_generation, scale=scale,
        chunk_backward=router_aux_backward(settings, models),
        num_params=sum(p.numel() for p in models.params), device=settings.device,
    )


def router_aux_backward(settings: GRPOSettings, models: BatchModels) -> ChunkBackward:
    """∇(scale · aux_b) of one micro-batch, with TRL's own forward (`compute_aux_loss=True`) over TRL's tensors."""
    eos_and_pad, params = list(settings.eos_and_pad), models.params

    def attended(rollout) -> list[int]:
        # TRL's completion_mask: every completion token (tool tokens too), all 0 for a masked truncated completion;
        # the truncation rule is loss_mask's (the one the policy term uses), applied without the env mask
        whole = replace(rollout, env_mask=None)
        return loss_mask(whole, eos_and_pad, settings.mask_truncated).int().tolist()

    def backward(rollouts, scale: float) -> tuple[torch.Tensor, float]:
        ids, mask, keep = padded_micro_batch(rollouts, settings.pad_token_id, attended,
                                             settings.args.pad_to_multiple_of, settings.device)
        _, _, aux = models.forward(models.module, ids, mask, keep, compute_aux_loss=True)
        if not aux.requires_grad:  # no trainable parameter reaches the routers (e.g. an adapter elsewhere)
            return torch.zeros(sum(p.numel() for p in params), device=ids.device), float(aux)
        grads = torch.autograd.grad(scale * aux, params, allow_unused=True)
        return flatten_grads(grads, params), float(aux.detach())

    return backward
