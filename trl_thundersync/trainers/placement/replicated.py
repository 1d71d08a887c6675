"""One process or DDP: every process holds the whole model, so each source's backward is local and the barrier
averages the processes' shares once (what DDP's all-reduce would have produced) and writes it into `param.grad`;
TRL's loop then clips it and takes the optimizer step."""

from __future__ import annotations

from typing import Any

import torch

from ...errors import NonFiniteGradientError
from ...streaming.gradient_sinks import all_finite
from ...streaming.source import write_flat_grads
from . import StreamingTarget


def trainable_parameters(module: torch.nn.Module) -> list[torch.Tensor]:
    """The parameters the optimizer updates, in `module.parameters()` order (the order of every flat P-vector)."""
    return [p for p in module.parameters() if p.requires_grad]


def refuse_non_finite(direction: torch.Tensor, label: str) -> None:
    """The step is refused, loudly, when the reduced batch direction holds NaN or inf."""
    if not all_finite(direction):  # one reduction: no parameter-sized mask at the barrier
        raise NonFiniteGradientError(f"the batch direction of {label} contains NaN/inf; the step is refused")


class ReplicatedPlacement:
    """Single process and DDP (`placement/__init__.py` for the lifecycle)."""

    def __init__(self, accelerator: Any) -> None:
        self.accelerator = accelerator
        self.name = "DDP" if accelerator.num_processes > 1 else "single process"
        self._params: list[torch.Tensor] = []

    def open_batch(self, model: torch.nn.Module) -> StreamingTarget:
        # the unwrapped module: DDP's reducer must not see the per-source passes
        module = self.accelerator.unwrap_model(model)
        self._params = trainable_parameters(module)
        return StreamingTarget(module, self._params)

    def hand_over(self, local: torch.Tensor, label: str) -> None:
        direction = local
        if self.accelerator.num_processes > 1:
            direction = self.accelerator.reduce(local, reduction="mean")
        refuse_non_finite(direction, label)
        write_flat_grads(direction, self._params)

    def add_share(self, local: torch.Tensor, label: str, *, final: bool) -> None:
        """A share that joins what TRL's own micro-steps of the same accumulation window put in `param.grad` (GKD's
        mixed windows: on- and off-policy micro-steps, each divided by the window's `num_items_in_batch`).

        Not the window's last micro-step: added to the local `param.grad`, as a `no_sync` backward would be (DDP's
        synced backward at the window's end then averages the accumulated gradient). The last one: the local
        accumulated gradient plus the share is averaged over the processes here and written, as `hand_over`."""
        if not final:
            refuse_non_finite(local, label)
            write_flat_grads(local, self._params, add=True)
            return
        held = [p.grad.reshape(-1).to(torch.float32) if p.grad is not None else torch.zeros(p.numel(), device=p.device)
                for p in self._params]
        self.hand_over(torch.cat(held).to(local.device) + local, label)

    def end_micro_step(self, sync_gradients: bool) -> None:
        """Nothing: the direction is in `param.grad` from the barrier on, and TRL's loop steps at the sync."""

    def publish_module(self, model: torch.nn.Module) -> torch.nn.Module:
        return self.accelerator.unwrap_model(model)

    def reference_module(self, ref_model: torch.nn.Module) -> torch.nn.Module:
        """The reference model itself: every process holds it whole (TRL prepares it without DDP)."""
        return ref_model

    def note_engine_step(self) -> None:
        """Nothing: the passes differentiate the engine's own parameters, never a copy."""
