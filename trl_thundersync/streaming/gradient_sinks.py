"""Where per-source parameter gradients go: the sinks every learner pass adds into, and the finiteness checks they
make before accepting a gradient (a NaN or inf entry raises `NonFiniteGradientError` naming the source; nothing is
added). `GradientSum` keeps one FP32 buffer per parameter, `FlatGradient` one flat FP32 vector in
`streaming.source.flatten_grads` order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from ..errors import NonFiniteGradientError


class GradientSink(Protocol):
    """Where one channel's parameter gradients go; `where` names the trajectory and turn for error messages."""

    def add(self, grads: Sequence[torch.Tensor | None], where: str) -> None: ...


def require_finite(grad: torch.Tensor, where: str) -> None:
    if not bool(torch.isfinite(grad).all()):
        raise NonFiniteGradientError(f"{where} produced a non-finite gradient; refusing to accumulate it")


def all_finite(vector: torch.Tensor) -> bool:
    """Whether every entry is finite, with one reduction in the common case: a finite sum has finite entries only;
    a non-finite sum (a NaN or inf entry, or finite entries overflowing) is checked entry-wise."""
    return bool(torch.isfinite(vector.sum())) or bool(torch.isfinite(vector).all())


def require_all_finite(grads: Sequence[torch.Tensor | None], where: str) -> None:
    """`require_finite` for every gradient of a pass, in one reduction per tensor and one sync: a non-finite entry
    makes its tensor's sum non-finite; a sum that overflowed from finite entries is then checked entry-wise."""
    present = [g for g in grads if g is not None]
    if present and not bool(torch.isfinite(torch.stack([g.sum() for g in present])).all()):
        for grad in present:
            require_finite(grad, where)


class GradientSum:
    """Σ of parameter gradients in FP32, one buffer per trainable parameter (the unnormalized Σ_j g_j)."""

    def __init__(self, params: Sequence[torch.Tensor]) -> None:
        self.params = list(params)
        self.buffers = [torch.zeros_like(p, dtype=torch.float32) for p in self.params]

    def add(self, grads: Sequence[torch.Tensor | None], where: str) -> None:
        require_all_finite(grads, where)
        for buffer, grad in zip(self.buffers, grads, strict=True):
            if grad is not None:
                buffer.add_(grad.to(torch.float32))


class FlatGradient:
    """Σ of parameter gradients as one flat FP32 vector (P,), in `streaming.source.flatten_grads` order."""

    def __init__(self, params: Sequence[torch.Tensor], device: torch.device | str | None = None) -> None:
        self.sizes = [p.numel() for p in params]
        device = device if device is not None else (params[0].device if params else "cpu")
        self.vector = torch.zeros(sum(self.sizes), dtype=torch.float32, device=device)

    def add(self, grads: Sequence[torch.Tensor | None], where: str) -> None:
        require_all_finite(grads, where)
        offset = 0
        for size, grad in zip(self.sizes, grads, strict=True):
            if grad is not None:
                self.vector[offset : offset + size].add_(grad.reshape(-1).to(torch.float32))
            offset += size

    @property
    def nbytes(self) -> int:
        return self.vector.numel() * self.vector.element_size()
