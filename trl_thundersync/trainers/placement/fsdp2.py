"""FSDP2 (`fully_shard`): unsharded local accumulation on a replica, one reduction at the barrier, written as shards.

Under FSDP2 every forward and backward of the sharded module is a collective (all-gather before, reduce-scatter
after) that all ranks must enter together, while each rank's sources finish at their own times; and
`torch.autograd.grad` with respect to the sharded (DTensor) parameters returns None, since the forward runs on
unsharded tensors. So the per-source passes do not run through the sharded module. Instead:

1. `open_batch`: every rank, all at the batch start together, gathers θ_k once (`DTensor.full_tensor`, one
   all-gather per parameter) into a local *replica* — the same module tree with plain parameters and no FSDP hooks;
2. the per-source passes run on the replica, locally (no collective while sources finish at their own times);
3. `hand_over`: the ranks' shares are averaged (one all-reduce of the trainable P-vector), refused if non-finite,
   and each rank writes its own slice of the direction into the DTensor parameters' `.grad` with the parameters'
   own placements (`distribute_tensor(..., src_data_rank=None)`: every rank holds the same full vector, so the slice
   is cut locally, no communication). TRL's loop then clips (accelerate's `clip_grad_norm_` on DTensors: the
   global norm) and the optimizer steps the shards;
4. `publish_module`: the replica, refreshed from the shards when they changed (the main process publishes it).

Memory per rank: the replica holds every parameter in full (P), the shards P/W, their gradients P_trainable/W, and
the streamed accumulators full P_trainable-vectors (what the learner reports); with beta != 0 and a separate
reference model, a replica of the reference too (`reference_module`; with PEFT the reference is the policy replica
with its adapter disabled, nothing more). Holding only the local shard in the accumulators would need every
per-source gradient to be reduce-scattered as it is produced — a collective per source, entered by every rank
together — which is the lock-step design this placement avoids: it ties each rank's sources to the slowest rank's
readiness and spends no-op passes (`benchmarks/sharded_design.py` measures both).
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import torch
from accelerate.logging import get_logger

from ...errors import ConfigurationError, UnsupportedOptionError
from . import StreamingTarget
from .replicated import refuse_non_finite

logger = get_logger(__name__)

ENGINE = "FSDP2 (fully_shard)"


def check_fsdp(accelerator: Any) -> None:
    """Refuse, at construction, the FSDP setups this placement does not cover (named, with the reason)."""
    plugin = accelerator.state.fsdp_plugin
    version = getattr(plugin, "fsdp_version", 1)
    if version != 2:
        raise UnsupportedOptionError(
            f"FSDP fsdp_version={version}: only FSDP2 (fsdp_version: 2, torch's fully_shard) is supported; FSDP1's "
            "flat parameters have no per-parameter DTensor to write the batch direction into. Set fsdp_version: 2")
    from torch.distributed.fsdp import CPUOffloadPolicy

    if isinstance(plugin.cpu_offload, CPUOffloadPolicy):  # FSDP2's no-offload default is a plain OffloadPolicy()
        raise UnsupportedOptionError(
            f"{ENGINE} cpu_offload: the offloaded shards' gradients and step are not covered by ThunderSync's "
            "barrier (untested); run FSDP2 without cpu_offload, or ZeRO-Offload via DeepSpeed where supported")


def check_fsdp_args(args: Any) -> None:
    """Refuse the trainer settings whose learner work would run through the sharded module (a collective entered at
    each rank's own time, so ranks would hang or mismatch)."""
    from .gkd_checks import check_gkd_engine

    check_gkd_engine(ENGINE, args)  # GKD: a served teacher, on-policy only
    if getattr(args, "num_iterations", 1) > 1:
        raise UnsupportedOptionError(
            f"{ENGINE} with num_iterations={args.num_iterations}: passes 2..μ replay TRL's own loss through the "
            "sharded module, which is not covered yet; use num_iterations=1 or DDP")


def _from_fsdp(hook: Any) -> bool:
    """Whether a module hook was registered by FSDP (its forward and state-dict hooks), looking through bound
    methods, partials and wrappers (FSDP wraps its forward hooks in `functools.wraps` and dynamo's disable). Other
    hooks stay: activation checkpointing's wrapper renames its state-dict keys back through one."""
    seen = 0
    while hook is not None and seen < 16:
        if (getattr(hook, "__module__", None) or "").startswith("torch.distributed.fsdp"):
            return True
        hook = getattr(hook, "__wrapped__", None) or getattr(hook, "__func__", None) or getattr(hook, "func", None)
        seen += 1
    return False


def _plain_class(module: torch.nn.Module) -> type:
    """The module's own class: `fully_shard` swaps it for a generated `FSDP<cls>(FSDPModule, cls)`."""
    from torch.distributed.fsdp import FSDPModule

    cls = type(module)
    if issubclass(cls, FSDPModule):
        return next(b for b in cls.__bases__ if not issubclass(b, FSDPModule))
    return cls


def replica_of(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """The same module tree with plain, uninitialized full-size parameters and without FSDP's hooks or state: a
    forward and backward through it are local. Buffers are shared with `module` (FSDP2 does not shard
    them); parameters shared within `module` (tied embeddings) stay shared. Fill with `refresh_replica`."""
    memo: dict[int, Any] = {}

    def clone(mod: torch.nn.Module) -> torch.nn.Module:
        if id(mod) in memo:
            return memo[id(mod)]
        cls = _plain_class(mod)
        new = cls.__new__(cls)
        memo[id(mod)] = new
        state = {}
        for key, value in mod.__dict__.items():
            if key.startswith("__composable_api"):  # fully_shard's state and registry
                continue
            if key.endswith("_hooks") or key.endswith("hooks_with_kwargs") or key.endswith("hooks_always_called"):
                if isinstance(value, dict):
                    value = type(value)((k, h) for k, h in value.items()
                                        if not (callable(h) and _from_fsdp(h)))
            state[key] = _rebound(value, mod, new)
        state["_parameters"] = {name: _placeholder(p, device, memo) for name, p in mod._parameters.items()}
        state["_buffers"] = dict(mod._buffers)
        state["_modules"] = {name: None if child is None else clone(child) for name, child in mod._modules.items()}
        new.__dict__.update(state)
        return new

    return clone(module)


def _rebound(value: Any, old: torch.nn.Module, new: torch.nn.Module) -> Any:
    """An instance attribute that is a method bound to `old`, bound to `new` instead — with the methods bound to
    `old` that its closure captured rebound too (TRL's `add_fused_lm_head` sets `model.forward` to a method whose
    closure holds the original forward)."""
    if not (isinstance(value, types.MethodType) and value.__self__ is old):
        return value
    func = value.__func__
    if func.__closure__:
        cells = tuple(types.CellType(_rebound(_cell_value(c), old, new)) if _cell_value(c) is not _EMPTY else c
                      for c in func.__closure__)
        clone = types.FunctionType(func.__code__, func.__globals__, func.__name__, func.__defaults__, cells)
        clone.__kwdefaults__, clone.__qualname__ = func.__kwdefaults__, func.__qualname__
        clone.__dict__.update(func.__dict__)
        func = clone
    return types.MethodType(func, new)


_EMPTY = object()


def _cell_value(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a cell not filled yet
        return _EMPTY


def _placeholder(param: torch.nn.Parameter | None, device: torch.device, memo: dict[int, Any]):
    if param is None:
        return None
    if id(param) not in memo:
        memo[id(param)] = torch.nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device=device),
                                             requires_grad=param.requires_grad)
    return memo[id(param)]


def paired_parameters(sharded: torch.nn.Module, replica: torch.nn.Module) -> list[tuple[Any, torch.Tensor]]:
    """(sharded DTensor parameter, replica parameter) by name, in `sharded.parameters()` order."""
    mine = dict(replica.named_parameters())
    pairs = []
    for name, p in sharded.named_parameters():
        if name not in mine or mine[name].shape != p.shape:
            raise ConfigurationError(f"{ENGINE}: the local replica has no parameter {name} of shape "
                                     f"{tuple(p.shape)}; this model's tree cannot be replicated")
        pairs.append((p, mine[name]))
    return pairs


@torch.no_grad()
def refresh_replica(pairs: list[tuple[Any, torch.Tensor]]) -> None:
    """Copy the full current weights into the replica (a collective: every rank, in the same order)."""
    for sharded, full in pairs:
        full.copy_(sharded.full_tensor() if hasattr(sharded, "full_tensor") else sharded)


def write_sharded_grads(direction: torch.Tensor, params: list[Any]) -> None:
    """Write the flat P-vector `direction` (the same on every rank) into the DTensor parameters' `.grad`, each rank
    keeping only its own shard, cut locally with the parameter's own mesh and placements (no communication)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    offset = 0
    for p in params:
        n = p.numel()
        full = direction[offset:offset + n].view(p.shape).to(dtype=p.dtype)
        offset += n
        if not isinstance(p, DTensor):  # a parameter fully_shard left alone (ignored_params): whole, on every rank
            p.grad = full.clone()
            continue
        grad = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None)
        if grad.to_local().shape != p.to_local().shape:
            raise ConfigurationError(f"{ENGINE}: the gradient shard {tuple(grad.to_local().shape)} does not match "
                                     f"the parameter shard {tuple(p.to_local().shape)}")
        p.grad = grad
    if offset != direction.numel():
        raise ConfigurationError(f"{ENGINE}: the batch direction has {direction.numel()} entries, the trainable "
                                 f"parameters {offset}")


@dataclass(frozen=True)
class PlacementMemory:
    """Per-rank memory of the FSDP2 placement, beside the streamed accumulators (the learner's own bound,
    `thundersync/stats_bound_mb`: FP32 P_trainable-vectors in full, not shards)."""

    replica_bytes: int  # the local replica: every parameter in full
    world_size: int  # processes the shards are spread over
    trainable_bytes: int  # trainable parameters in full (their shards and gradient shards are this / world_size)
    trainable_params: int  # P_trainable: the length of every streamed P-vector

    @property
    def bound_bytes(self) -> int:
        """Replica + parameter shards + gradient shards (the optimizer state of the shards comes on top)."""
        return self.replica_bytes + (self.replica_bytes + self.trainable_bytes) // self.world_size

    def describe(self) -> str:
        mib = 2**20
        return (f"{ENGINE}: per-rank parameter memory {self.bound_bytes / mib:.1f} MiB = replica "
                f"{self.replica_bytes / mib:.1f} MiB (full weights) + shards and gradient shards over "
                f"{self.world_size} ranks; the streamed accumulators hold full FP32 vectors of "
                f"P={self.trainable_params} (thundersync/stats_bound_mb)")


class FSDP2Placement:
    """FSDP2 full shard (`placement/__init__.py` for the lifecycle, this module's docstring for the design)."""

    name = ENGINE

    def __init__(self, accelerator: Any, args: Any) -> None:
        check_fsdp_args(args)
        self.accelerator = accelerator
        self._sync_reference = bool(getattr(args, "sync_ref_model", False))  # TRL moves it every N steps
        self._reference: tuple[torch.nn.Module, torch.nn.Module, list] | None = None  # (sharded, replica, pairs)
        self._pairs: list[tuple[Any, torch.Tensor]] = []
        self._replica: torch.nn.Module | None = None
        self._fresh = False  # the replica holds the shards' current values (False after every hand-over)

    def _ensure_replica(self, model: torch.nn.Module) -> torch.nn.Module:
        if self._replica is None:
            sharded = self.accelerator.unwrap_model(model)
            self._replica = replica_of(sharded, self.accelerator.device)
            self._replica.train(sharded.training)
            self._pairs = paired_parameters(sharded, self._replica)
            logger.info(self.memory().describe())
        if not self._fresh:
            refresh_replica(self._pairs)
            self._fresh = True
        return self._replica

    def memory(self) -> PlacementMemory:
        """This placement's per-rank memory (after the first batch built the replica)."""
        trainable = sum(full.numel() * full.element_size() for _, full in self._pairs if full.requires_grad)
        return PlacementMemory(
            replica_bytes=sum(full.numel() * full.element_size() for _, full in self._pairs),
            world_size=self.accelerator.num_processes, trainable_bytes=trainable,
            trainable_params=sum(full.numel() for _, full in self._pairs if full.requires_grad))

    def open_batch(self, model: torch.nn.Module) -> StreamingTarget:
        replica = self._ensure_replica(model)
        return StreamingTarget(replica, [full for _, full in self._pairs if full.requires_grad])

    def hand_over(self, local: torch.Tensor, label: str) -> None:
        direction = self.accelerator.reduce(local, reduction="mean") if self.accelerator.num_processes > 1 else local
        refuse_non_finite(direction, label)
        write_sharded_grads(direction, [p for p, full in self._pairs if full.requires_grad])
        self._fresh = False  # the optimizer steps the shards next

    def end_micro_step(self, sync_gradients: bool) -> None:
        """Nothing: the direction is in the shards' `.grad` from the barrier on, and TRL's loop steps at the sync."""

    def publish_module(self, model: torch.nn.Module) -> torch.nn.Module:
        return self._ensure_replica(model)

    def reference_module(self, ref_model: torch.nn.Module) -> torch.nn.Module:
        """A replica of the reference model (TRL shards it too), gathered once — at every batch start with
        `sync_ref_model`, whose callback moves it — so the per-source reference forwards are local as well."""
        sharded = self.accelerator.unwrap_model(ref_model)
        if self._reference is None or self._reference[0] is not sharded:
            replica = replica_of(sharded, self.accelerator.device).eval()
            self._reference = (sharded, replica, paired_parameters(sharded, replica))
            refresh_replica(self._reference[2])
            logger.info(f"{ENGINE}: per-rank reference replica {self._bytes(self._reference[2]) / 2**20:.1f} MiB")
        elif self._sync_reference:
            refresh_replica(self._reference[2])
        return self._reference[1]

    def note_engine_step(self) -> None:
        """TRL's own micro-step moves the shards: gather the replica again before the next batch or publication."""
        self._fresh = False

    @staticmethod
    def _bytes(pairs: list[tuple[Any, torch.Tensor]]) -> int:
        return sum(full.numel() * full.element_size() for _, full in pairs)
