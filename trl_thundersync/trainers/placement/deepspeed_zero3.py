"""DeepSpeed ZeRO-3: partitioned parameters, streamed through one local unsharded replica per process.

Under ZeRO-3 every forward of the engine's module all-gathers its parameters, a collective that all ranks must enter
together, while each rank's sources become ready at their own times. So at each logical batch's start (all ranks are
there together) every rank gathers θ_k once into a plain replica of the policy (the same class and config, no
DeepSpeed hooks), and the per-source passes differentiate the replica: no collective runs while sources finish.

At the window's last micro-step the direction goes to the engine as in ZeRO-1/2 (`deepspeed.py`): the surrogate
Σ_p ⟨p, d_p⟩ over the engine's parameters, built and back-propagated while they are gathered, so ZeRO-3's own
gradient hooks reduce-scatter it (the mean over ranks), and `engine.step()` clips and updates the partitions.
`publish_module` returns the replica, refreshed to the current θ (a collective: every rank calls it at the same
point, `lifecycle.py`).

Memory: the replica holds all P parameters on every rank (4·P bytes in FP32, 2·P in bf16), on top of the
engine's partitions and the streamed statistics; `open_batch` logs the bound once.
"""

from __future__ import annotations

import logging
import types
from typing import Any

import torch

from ...errors import UnsupportedOptionError
from . import StreamingTarget
from .deepspeed import DeepSpeedPlacement, surrogate
from .fsdp2 import _rebound
from .replicated import trainable_parameters

logger = logging.getLogger(__name__)


def check_zero3(args: Any) -> None:
    """What the replica design does not cover under ZeRO-3, refused by field."""
    from .gkd_checks import is_gkd

    # GKD's beta is the generalized JSD's interpolation weight, not a KL to a reference model: no reference model
    if args is not None and not is_gkd(args) and float(getattr(args, "beta", 0.0) or 0.0) != 0.0:
        raise UnsupportedOptionError(
            f"DeepSpeed ZeRO-3: beta={args.beta}: TRL prepares the reference model as a partitioned DeepSpeed engine, "
            "whose forward is a collective that cannot run per source; use beta=0.0, ZeRO-2 or DDP"
        )


def build_replica(module: torch.nn.Module, device: torch.device, args: Any) -> torch.nn.Module:
    """A plain module of the policy's class and config (allocated, not initialized: `refresh` fills it), with the
    fused LM head TRL's GRPOTrainer and SFTTrainer patch into the policy's instance (log-probs, entropy, ...)."""
    config = getattr(module, "config", None)
    if config is None or getattr(module, "peft_config", None) is not None:
        raise UnsupportedOptionError(
            f"DeepSpeed ZeRO-3: the policy {type(module).__name__} is not a plain transformers model (PEFT adapters "
            "or no `config`); ThunderSync builds its unsharded replica from the class and config; use ZeRO-2")
    from transformers.initialization import no_init_weights

    with torch.device(device), no_init_weights():  # allocated where it runs, tied weights kept tied
        replica = type(module)(config)
    if hasattr(replica, "tie_weights"):  # no_init_weights also skips the tying; the check in `_refresh` verifies
        replica.tie_weights()
    if getattr(module, "is_activation_checkpointing", False):  # the same activation memory as the policy's passes
        replica.activation_checkpointing_enable(
            activation_checkpointing_kwargs=getattr(args, "activation_checkpointing_kwargs", None))
    patched = vars(module).get("forward")
    if isinstance(patched, types.MethodType) and patched.__self__ is module:
        # TRL patched the instance (`add_fused_lm_head`, with GRPO's or SFT's own settings): the same method, its
        # captured original forward bound to the replica (`fsdp2._rebound`, as FSDP2's replica keeps it)
        replica.forward = _rebound(patched, module, replica)
    return replica


class ZeRO3Placement(DeepSpeedPlacement):
    """DeepSpeed ZeRO-3 (`placement/__init__.py` for the lifecycle, the module docstring for the design)."""

    def __init__(self, accelerator: Any, args: Any = None) -> None:
        super().__init__(accelerator, args)
        self.args = args
        self._replica: torch.nn.Module | None = None
        self.replica_bytes = 0  # the replica's parameter memory on every rank (known once it is built)
        self._fresh = False  # the replica holds the engine's current θ (false after every optimizer step)
        self._frozen: tuple[torch.nn.Module, torch.nn.Module] | None = None  # (partitioned, local copy): a teacher

    def _gathered(self, params: list[torch.Tensor]):
        import deepspeed

        return deepspeed.zero.GatheredParameters(params, modifier_rank=None)

    def _refresh(self, model: torch.nn.Module) -> torch.nn.Module:
        """Every rank gathers θ once and copies it into its replica (a collective: all ranks call it together)."""
        module = self.accelerator.unwrap_model(model)
        if self._replica is None:
            self._replica = build_replica(module, self.accelerator.device, self.args)
            self.replica_bytes = sum(p.numel() * p.element_size() for p in self._replica.parameters())
            if self.accelerator.is_main_process:  # a warning: ZeRO-3 users expect sharded weights, this is not
                logger.warning("%s: ThunderSync streams through an unsharded replica of the policy on every rank: "
                               "%.1f MB of parameters per rank, besides the engine's partitions and the streamed "
                               "statistics", self.name, self.replica_bytes / 2**20)
        if self._fresh:
            return self._replica
        self._gather_into(self._replica, module)
        self._replica.train(module.training)
        self._fresh = True
        return self._replica

    def _gather_into(self, replica: torch.nn.Module, module: torch.nn.Module) -> None:
        """Copy the partitioned `module`'s whole parameters (gathered: a collective, every rank together) and its
        buffers into `replica`, which must have the same parameter names."""
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

        replica_params = dict(replica.named_parameters())
        source = list(module.named_parameters())
        differ = sorted(set(replica_params).symmetric_difference(name for name, _ in source))
        if differ:
            raise UnsupportedOptionError(
                f"{self.name}: the replica of {type(module).__name__} does not have its parameters "
                f"({', '.join(differ[:4])} differ: a model its class and config do not rebuild); use ZeRO-2")
        with torch.no_grad(), self._gathered([p for _, p in source]):
            for name, p in source:
                target = replica_params[name]
                if target.shape == p.shape and target.dtype == p.dtype:
                    target.copy_(p.data)
                else:  # the first copy: the replica takes the engine's dtype (bf16 under DeepSpeed's bf16)
                    target.data = p.data.detach().clone()
                target.requires_grad_(p.requires_grad)
                # TRL's fused LM head gathers ZeRO-3 parameters not marked available (`maybe_gather_lm_head_ctx`,
                # a collective): the replica's are whole, and saying so keeps its forward local
                target.ds_status = ZeroParamStatus.AVAILABLE
        replica_buffers = dict(replica.named_buffers())
        with torch.no_grad():
            for name, b in module.named_buffers():
                replica_buffers[name].data = b.detach().clone()

    def open_batch(self, model: torch.nn.Module) -> StreamingTarget:
        replica = self._refresh(model)
        self._engine_params = trainable_parameters(self.accelerator.unwrap_model(model))
        self._params = trainable_parameters(replica)
        self._pending = None
        return StreamingTarget(replica, self._params)

    def end_micro_step(self, sync_gradients: bool) -> None:
        if not sync_gradients:
            return
        if self._pending is None:
            raise RuntimeError(f"{self.name}: an accumulation window closed without a batch direction")
        engine = self._engine()
        engine.set_gradient_accumulation_boundary(is_boundary=True)
        with self._gathered(self._engine_params):  # the surrogate needs the parameters' full shapes
            engine.backward(surrogate(self._engine_params, self._pending), scale_wrt_gas=False)
        engine.step()
        self._pending = None
        self._fresh = False

    def publish_module(self, model: torch.nn.Module) -> torch.nn.Module:
        return self._refresh(model)

    def note_engine_step(self) -> None:
        """TRL's own micro-step moves the partitions: gather the replica again before the next batch or
        publication."""
        self._fresh = False

    def reference_module(self, ref_model: torch.nn.Module) -> torch.nn.Module:
        """A frozen model TRL prepared as a partitioned engine (GKD's local teacher), gathered ONCE into a plain
        local copy on every rank (a collective: every rank, at the first batch), so its forward per source is local.
        GRPO's reference model (beta != 0) stays refused under ZeRO-3 (`check_zero3`)."""
        module = self.accelerator.unwrap_model(ref_model)
        module = getattr(module, "module", module)  # TRL's `prepare_deepspeed` returns the engine itself
        if self._frozen is not None and self._frozen[0] is module:
            return self._frozen[1]
        replica = build_replica(module, self.accelerator.device, self.args).eval()
        self._gather_into(replica, module)
        replica.requires_grad_(False)
        self._frozen = (module, replica)
        if self.accelerator.is_main_process:
            logger.warning("%s: the frozen %s is gathered into an unsharded copy on every rank (%.1f MB) so that its "
                           "forward per turn is local", self.name, type(module).__name__,
                           sum(p.numel() * p.element_size() for p in replica.parameters()) / 2**20)
        return replica
