"""DeepSpeed ZeRO-1/2: replicated parameters, so each source's backward is local; the engine gets the batch
direction once per window through its own backward, so ITS reduction over ranks, gradient clipping
(`gradient_clipping` = TRL's `max_grad_norm`), optimizer step, LR schedule and zero_grad all see it.

How accelerate drives DeepSpeed (accelerate 1.15 `utils/deepspeed.py`): `DeepSpeedEngineWrapper.backward(loss,
sync_gradients)` sets the engine's accumulation boundary from `sync_gradients`, calls `engine.backward(loss)` (which
divides by the engine's gradient_accumulation_steps) and `engine.step()` only at the boundary; the optimizer
wrapper's `step`/`zero_grad` are no-ops. ThunderSync's `training_step` never calls `accelerator.backward`, so this
placement plays that part at the window's last micro-step, with the surrogate

    L_s = Σ_p ⟨p, d_p⟩        (d: this process's share of the batch direction, detached;  ∂L_s/∂p = d_p)

and `engine.backward(L_s, scale_wrt_gas=False)` (d is already the whole window's direction), then `engine.step()`.
The engine averages the ranks' gradients, which is the direction's convention (the mean of the shares).

The per-source passes differentiate the unwrapped module with `torch.autograd.grad(..., inputs=params)`: that never
runs the parameters' AccumulateGrad nodes, so ZeRO's gradient hooks (`register_post_accumulate_grad_hook`,
deepspeed/utils/torch.py) do not fire and the engine sees nothing until the surrogate.

ZeRO-3 partitions the parameters: every forward is a collective the ranks must enter together, while sources become
ready at each rank's own time; `deepspeed_zero3.py` streams through an unsharded replica instead. The options this
placement was not tested with are refused (`check_deepspeed`, messages naming stage and field).
"""

from __future__ import annotations

from typing import Any

import torch

from ...errors import NonFiniteGradientError, UnsupportedOptionError
from ...streaming.gradient_sinks import all_finite
from . import StreamingTarget
from .replicated import trainable_parameters

SUPPORTED_STAGES = (1, 2, 3)  # 3: through a replica (`deepspeed_zero3.py`)


def _offload_device(zero: dict, key: str) -> str:
    section = zero.get(key) or {}
    return str(section.get("device", "none") or "none").lower()


def check_deepspeed(accelerator: Any, args: Any = None) -> None:
    """Refuse, at construction, the DeepSpeed setups this placement does not cover (stage / field, and why)."""
    config = accelerator.state.deepspeed_plugin.deepspeed_config
    zero = config.get("zero_optimization") or {}
    stage = _stage(accelerator)
    if stage == 0:
        raise UnsupportedOptionError(
            "DeepSpeed ZeRO-0: zero_optimization.stage=0 is DeepSpeed's plain data parallelism, which ThunderSync's "
            "DeepSpeed placement does not test; use DDP (the same replication, covered) or ZeRO-1/2/3")
    if stage not in SUPPORTED_STAGES:
        raise UnsupportedOptionError(f"DeepSpeed ZeRO-{stage}: zero_optimization.stage must be 1, 2 or 3")
    if stage == 3:
        from .deepspeed_zero3 import check_zero3

        check_zero3(args)
    for key in ("offload_optimizer", "offload_param"):
        if _offload_device(zero, key) != "none":
            raise UnsupportedOptionError(
                f"DeepSpeed ZeRO-{stage}: zero_optimization.{key}.device={_offload_device(zero, key)!r} is not "
                "supported by ThunderSync's DeepSpeed placement (untested); set it to 'none'"
            )
    if config.get("managed_gradient_accumulation", True) is False:
        raise UnsupportedOptionError(
            f"DeepSpeed ZeRO-{stage}: managed_gradient_accumulation=false: ThunderSync hands the batch direction to "
            "the engine at TRL's accumulation boundary (engine.set_gradient_accumulation_boundary), which that mode "
            "does not allow; remove the field"
        )
    from .gkd_checks import check_gkd_engine

    check_gkd_engine(f"DeepSpeed ZeRO-{stage}", args)  # GKD: a served teacher, on-policy only
    if args is not None and getattr(args, "num_iterations", 1) > 1:
        raise UnsupportedOptionError(
            f"DeepSpeed ZeRO-{stage}: num_iterations={args.num_iterations}: passes 2..num_iterations run TRL's own "
            "step, which is not covered under DeepSpeed yet; use num_iterations=1 or DDP"
        )


def refuse_non_finite_anywhere(accelerator: Any, local: torch.Tensor, label: str) -> None:
    """Every rank refuses the step when any rank's share holds NaN/inf (one scalar all-reduce, before the engine's
    collective: no rank is left waiting in the engine's reduction)."""
    bad = torch.tensor(0.0 if all_finite(local) else 1.0, device=local.device)
    if accelerator.num_processes > 1:
        bad = accelerator.reduce(bad, reduction="sum")
    if float(bad) > 0:
        raise NonFiniteGradientError(
            f"the batch direction of {label} contains NaN/inf (on {int(float(bad))} process(es)); the step is refused")


def surrogate(params: list[torch.Tensor], direction: torch.Tensor) -> torch.Tensor:
    """Σ_p ⟨p, d_p⟩ with d detached: its gradient with respect to each parameter is that parameter's slice of d."""
    size = sum(p.numel() for p in params)
    if size != direction.numel():
        raise ValueError(f"direction has {direction.numel()} entries, the trainable parameters {size}")
    total = direction.new_zeros(())
    offset = 0
    for p in params:
        n = p.numel()
        total = total + (p * direction[offset : offset + n].view_as(p).to(p.dtype)).sum()
        offset += n
    return total


def deepspeed_placement(accelerator: Any, args: Any = None) -> DeepSpeedPlacement:
    """The placement for the engine's ZeRO stage: replicated parameters here, ZeRO-3 through a replica."""
    check_deepspeed(accelerator, args)
    if _stage(accelerator) == 3:
        from .deepspeed_zero3 import ZeRO3Placement

        return ZeRO3Placement(accelerator, args)
    return DeepSpeedPlacement(accelerator, args)


def _stage(accelerator: Any) -> int:
    zero = accelerator.state.deepspeed_plugin.deepspeed_config.get("zero_optimization") or {}
    return int(zero.get("stage", 0) or 0)


class DeepSpeedPlacement:
    """DeepSpeed ZeRO-1/2 (`placement/__init__.py` for the lifecycle, the module docstring for the hand-over);
    the base of `ZeRO3Placement`."""

    def __init__(self, accelerator: Any, args: Any = None) -> None:
        self.accelerator = accelerator
        self.stage = _stage(accelerator)
        self.name = f"DeepSpeed ZeRO-{self.stage}"
        self._params: list[torch.Tensor] = []
        self._pending: torch.Tensor | None = None  # this process's share, from the barrier to the window's end

    def _engine(self) -> Any:
        wrapped = getattr(self.accelerator, "deepspeed_engine_wrapped", None)
        if wrapped is None:
            raise UnsupportedOptionError(
                f"{self.name}: the model was not prepared by accelerate's DeepSpeed integration (no engine); "
                "train through the trainer's `train()`")
        return wrapped.engine

    def open_batch(self, model: torch.nn.Module) -> StreamingTarget:
        # the engine's module: the per-source passes must not enter the engine's backward (see the module docstring)
        module = self.accelerator.unwrap_model(model)
        self._params = trainable_parameters(module)
        self._pending = None
        return StreamingTarget(module, self._params)

    def hand_over(self, local: torch.Tensor, label: str) -> None:
        refuse_non_finite_anywhere(self.accelerator, local, label)
        self._pending = local.detach()

    def end_micro_step(self, sync_gradients: bool) -> None:
        """At the window's last micro-step: the direction through the engine's backward and step (what accelerate's
        `DeepSpeedEngineWrapper.backward` does at the boundary); earlier micro-steps add nothing."""
        if not sync_gradients:
            return
        if self._pending is None:
            raise RuntimeError(f"{self.name}: an accumulation window closed without a batch direction")
        engine = self._engine()
        engine.set_gradient_accumulation_boundary(is_boundary=True)
        engine.backward(surrogate(self._params, self._pending), scale_wrt_gas=False)
        engine.step()
        self._pending = None

    def publish_module(self, model: torch.nn.Module) -> torch.nn.Module:
        return self.accelerator.unwrap_model(model)

    def reference_module(self, ref_model: torch.nn.Module) -> torch.nn.Module:
        """TRL's reference model as TRL prepared it (ZeRO-1/2: a stage-0 inference engine whose forward is local, no
        collective); ZeRO-3 (`ZeRO3Placement`) gathers a partitioned one into a local copy."""
        return ref_model

    def note_engine_step(self) -> None:
        """Nothing: ZeRO-1/2 passes differentiate the engine's own (replicated) parameters."""
