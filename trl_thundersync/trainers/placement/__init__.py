"""Where a ThunderSync trainer's learner work runs, and how the batch direction reaches the engine's optimizer step.

Both trainers stream per-source backward passes at the frozen θ_k and assemble one batch direction at the barrier.
What differs between training engines (one process, DDP, DeepSpeed ZeRO-1/2/3, FSDP2) is only (a) which module and
parameters those passes differentiate, (b) how the direction is reduced across processes and handed to the engine
so that the engine's own clipping and optimizer step see it, and (c) which module holds the full weights to publish.
A `LearnerPlacement` owns exactly that; the trainers call it and hold no engine-specific code.

Lifecycle, on every process in the same order (each call may be a collective):

1. `open_batch(model)` at the start of every logical batch → `StreamingTarget` (the module and the flat parameter
   order for the per-source passes, at θ_k);
2. the per-source passes (local: no collective runs while sources finish at their own times);
3. `hand_over(local, label)` at the barrier: `local` is this process's share of the batch direction, the direction
   being the mean of the shares over processes (DDP's averaging convention); the placement reduces it, refuses a
   non-finite direction (`NonFiniteGradientError`, `label` names the step) and gives it to the engine;
4. `end_micro_step(sync_gradients)` after every micro-step of TRL's accumulation window (engines that step inside
   their backward take the direction at the window's last micro-step);
5. `publish_module(model)` whenever θ is published: a module with the full current weights (the engine's publish
   then runs on the main process only, `rollout/publish_role.py`);
6. `reference_module(ref_model)` at the batch start when the trainer has a separate reference model (beta != 0),
   or a local distillation teacher: the module whose forward gives the reference log-probs (the teacher's logits)
   per source, locally;
7. `note_engine_step()` whenever TRL's own code runs a micro-step through the engine (GKD's off-policy steps): the
   parameters will move without a hand-over, so a replica of them is stale from then on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from accelerate.utils import DistributedType

from ...errors import UnsupportedOptionError


@dataclass(frozen=True)
class StreamingTarget:
    """What the per-source passes of one logical batch differentiate."""

    module: torch.nn.Module  # the policy at θ_k, without DDP/engine hooks (no collective in its forward/backward)
    params: list[torch.Tensor]  # its trainable parameters, in the order of every flat P-vector of the batch


class LearnerPlacement(Protocol):
    """One training engine's side of the streamed step (lifecycle in the module docstring)."""

    name: str  # the engine, as error messages and the start-up report name it ("single process", "DDP", ...)

    def open_batch(self, model: torch.nn.Module) -> StreamingTarget: ...

    def hand_over(self, local: torch.Tensor, label: str) -> None: ...

    def end_micro_step(self, sync_gradients: bool) -> None: ...

    def publish_module(self, model: torch.nn.Module) -> torch.nn.Module: ...

    def reference_module(self, ref_model: torch.nn.Module) -> torch.nn.Module: ...

    def note_engine_step(self) -> None: ...


def check_engine(accelerator: Any, args: Any = None) -> None:
    """Refuse, at construction, a training engine no placement supports (named, with the reason); `args`, the
    trainer's config, lets a placement refuse the fields it does not cover."""
    kind = accelerator.distributed_type
    refuse_silent_fallback(kind, getattr(accelerator, "num_processes", 1), os.environ)
    if kind == DistributedType.FSDP:
        from .fsdp2 import check_fsdp, check_fsdp_args

        check_fsdp(accelerator)
        if args is not None:
            check_fsdp_args(args)
    elif kind == DistributedType.DEEPSPEED:
        from .deepspeed import check_deepspeed

        check_deepspeed(accelerator, args)


# what `accelerate launch --config_file` (or TrainingArguments' `fsdp` / `deepspeed`) asks for, in the environment
_REQUESTED_ENGINES = {"ACCELERATE_USE_FSDP": DistributedType.FSDP,
                      "ACCELERATE_USE_DEEPSPEED": DistributedType.DEEPSPEED}


def refuse_silent_fallback(kind: DistributedType, num_processes: int, environ: Any) -> None:
    """Refuse a run whose launcher asked for FSDP or DeepSpeed while accelerate set up another engine: accelerate 1.15
    enables both only on GPU process groups, so on the CPU an FSDP config silently trains as DDP and a DeepSpeed one as
    independent single processes (`num_processes=1` on every rank) — not the run that was configured."""
    for variable, wanted in _REQUESTED_ENGINES.items():
        if str(environ.get(variable, "false")).lower() in ("1", "true") and kind != wanted:
            raise UnsupportedOptionError(
                f"{variable}=true asks for {wanted.value}, but accelerate set up {kind.value} with {num_processes} "
                "process(es) (accelerate enables it only on GPU process groups); the run would not use the engine it "
                "was configured for. Launch it on GPUs, or use configs/ddp.yaml on the CPU")


def learner_placement(accelerator: Any, args: Any) -> LearnerPlacement:
    """The placement for a trainer's `accelerator` and config `args` (call after `accelerator.prepare`, i.e. inside
    `train`)."""
    check_engine(accelerator, args)
    if accelerator.distributed_type == DistributedType.FSDP:
        from .fsdp2 import FSDP2Placement

        return FSDP2Placement(accelerator, args)
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        from .deepspeed import deepspeed_placement

        return deepspeed_placement(accelerator, args)
    from .replicated import ReplicatedPlacement

    return ReplicatedPlacement(accelerator)


def unplaced_policy(accelerator: Any, model: torch.nn.Module) -> torch.nn.Module:
    """The policy before `train` built the placement (e.g. `trainer.rollout_engine` read before `train()`), refused
    where its parameters are already partitioned: under ZeRO-3 transformers loads them partitioned (zero.Init), and a
    rollout server started from them would get empty tensors."""
    module = accelerator.unwrap_model(model)
    if isinstance(module, torch.nn.Module) and any(hasattr(p, "ds_id") for p in module.parameters()):
        raise UnsupportedOptionError(
            "DeepSpeed ZeRO-3: the policy's parameters are partitioned before train() (zero.Init); its full weights "
            "are gathered only once train() builds the learner placement, so let train() build the rollout engine "
            "(do not read trainer.rollout_engine before it)"
        )
    return module
