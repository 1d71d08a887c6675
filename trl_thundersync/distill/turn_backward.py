"""Per-turn student backward at the frozen θ_k, and the gradient sum it feeds.

A trajectory's turn j is conditioned on context_j (prompt, earlier actions, observations) and scores action_j.

`NaiveTurnBackward`: forward over context_j + action_j, backward through all of it. Turn j re-runs turns 0..j−1,
so a trajectory of n turns costs Σ_j |context_j| ≈ O(n²) token passes.

`BoundaryCutBackward` (paper Appendix I, "deferred state adjoints"): segment j is what turn j appended (the
observation framing since turn j−1, then action_j; segment 0 starts with the prompt).

    turn j:  forward segment j only, over the key/value states of segments < j given as *detached proxies that
             require grad* (and, if segment j starts with its action, the previous segment's last logits row as a
             proxy too); backward the turn loss → parameter gradients now, plus adjoints ∂L/∂proxy, which are added
             into the adjoint buffers of the earlier segments they came from. Segment j's graph is retained: its own
             key/values feed later turns.
    close:   for j = n−1 … 0, backward segment j's retained outputs (key/values, last logits) with the adjoints
             later turns sent them → parameter gradients, and adjoints for segments < j. Then everything is freed.

Every segment is forwarded once and back-propagated twice (its loss, then its deferred adjoints), so the cost is
linear in the trajectory length. The sum of parameter gradients equals the naive one (tests/…/test_turn_backward).
Needs a Hugging Face causal LM with a `DynamicCache`-compatible attention (full attention layers).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ..errors import NonFiniteGradientError, TurnOrderError
from ..types import TurnEvent
from .records import TeacherScores

# (student logits (T, V) at the action positions, actions (T,), teacher scores) -> scalar loss summed over tokens
TurnObjective = Callable[[torch.Tensor, torch.Tensor, TeacherScores], torch.Tensor]


class GradientSum:
    """Σ of parameter gradients in FP32, one buffer per trainable parameter (the unnormalized Σ_j g_j)."""

    def __init__(self, params: Sequence[torch.Tensor]) -> None:
        self.params = list(params)
        self.buffers = [torch.zeros_like(p, dtype=torch.float32) for p in self.params]

    def add(self, grads: Sequence[torch.Tensor | None], where: str) -> None:
        for buffer, grad in zip(self.buffers, grads):
            if grad is not None:
                if not bool(torch.isfinite(grad).all()):
                    raise NonFiniteGradientError(f"{where} produced a non-finite gradient; refusing to accumulate it")
                buffer.add_(grad.to(torch.float32))


@dataclass(frozen=True)
class TurnOutcome:
    loss_value: float  # Σ_t of the per-token loss value (before normalization)
    scored_tokens: int  # |M_j|
    forwarded_tokens: int  # tokens run through the student for this turn (the work it cost)


class TurnBackward(Protocol):
    """What the distillation learner calls: `turn` once per turn in order, `close` once per trajectory."""

    def turn(self, event: TurnEvent, teacher: TeacherScores) -> TurnOutcome: ...

    def close(self, index: int) -> int: ...  # returns the context tokens replayed


def _logits(model: Any, ids: Sequence[int], device: torch.device, cache=None) -> torch.Tensor:
    # transformers renamed `past_key_values` to `cache`; pass whichever this version's forward takes
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    kwargs = {name: cache, "use_cache": True} if cache is not None else {"use_cache": False}
    return model(input_ids=torch.tensor([list(ids)], device=device), **kwargs).logits[0]


class NaiveTurnBackward:
    """Reference: every turn re-runs its whole context."""

    def __init__(self, model: Any, params: Sequence[torch.Tensor], objective: TurnObjective, grads: GradientSum,
                 device: torch.device | str = "cpu") -> None:
        self.model, self.params, self.objective, self.grads = model, list(params), objective, grads
        self.device = torch.device(device)

    def turn(self, event: TurnEvent, teacher: TeacherScores) -> TurnOutcome:
        context, action = list(event.context_ids), list(event.action_ids)
        if not action:
            return TurnOutcome(0.0, 0, 0)
        logits = _logits(self.model, context + action, self.device)[len(context) - 1 : -1]
        loss = self.objective(logits, torch.tensor(action, device=self.device), teacher)
        grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        self.grads.add(grads, f"trajectory {event.index} turn {event.turn}")
        return TurnOutcome(float(loss.detach()), len(action), len(context) + len(action))

    def close(self, index: int) -> int:
        return 0


@dataclass
class _Segment:
    """One turn's appended tokens with their retained graph and the adjoints later turns sent back."""

    length: int
    keys: list[torch.Tensor]  # per layer (1, kv_heads, length, head_dim), graph-attached
    values: list[torch.Tensor]
    last_logits: torch.Tensor  # (V,) logits at the segment's last position, graph-attached
    past_proxies: list[torch.Tensor]  # [K_0, V_0, K_1, V_1, …] of segments < this one, as consumed by its forward
    logits_proxy: torch.Tensor | None  # previous segment's last logits, when this segment started with its action
    key_adjoints: list[torch.Tensor | None] = field(default_factory=list)
    value_adjoints: list[torch.Tensor | None] = field(default_factory=list)
    logits_adjoint: torch.Tensor | None = None

    def __post_init__(self) -> None:
        self.key_adjoints = [None] * len(self.keys)
        self.value_adjoints = [None] * len(self.values)


@dataclass
class _Trajectory:
    ids: list[int] = field(default_factory=list)  # every token forwarded so far
    segments: list[_Segment] = field(default_factory=list)


def _accumulate(slot: torch.Tensor | None, grad: torch.Tensor | None) -> torch.Tensor | None:
    if grad is None:
        return slot
    return grad.clone() if slot is None else slot.add_(grad)


class BoundaryCutBackward:
    """Linear-cost per-turn backward with deferred state adjoints; see the module docstring."""

    def __init__(self, model: Any, params: Sequence[torch.Tensor], objective: TurnObjective, grads: GradientSum,
                 device: torch.device | str = "cpu") -> None:
        self.model, self.params, self.objective, self.grads = model, list(params), objective, grads
        self.device = torch.device(device)
        self.open: dict[int, _Trajectory] = {}

    def turn(self, event: TurnEvent, teacher: TeacherScores) -> TurnOutcome:
        from transformers import DynamicCache

        state = self.open.setdefault(event.index, _Trajectory())
        context, action = list(event.context_ids), list(event.action_ids)
        if context[: len(state.ids)] != state.ids:
            raise TurnOrderError(
                f"trajectory {event.index} turn {event.turn}: its context does not extend the tokens of the earlier "
                "turns; the boundary-cut backward needs an append-only token history (tokens in, tokens out)"
            )
        new = context[len(state.ids) :] + action
        if not new:
            return TurnOutcome(0.0, 0, 0)
        past = [(torch.cat([s.keys[l].detach() for s in state.segments], dim=-2).requires_grad_(),
                 torch.cat([s.values[l].detach() for s in state.segments], dim=-2).requires_grad_())
                for l in range(len(state.segments[0].keys))] if state.segments else []
        cache = DynamicCache(ddp_cache_data=past) if past else DynamicCache()
        logits = _logits(self.model, new, self.device, cache)
        start = len(state.ids)
        layers = [cache.layers[l] for l in range(len(cache.layers))]
        keys = [layer.keys[:, :, start:] for layer in layers]
        values = [layer.values[:, :, start:] for layer in layers]
        first = len(new) - len(action) - 1  # segment row predicting the first action token
        logits_proxy = None
        if action and first < 0:  # the action starts the segment: its first token is predicted by the last one
            logits_proxy = state.segments[-1].last_logits.detach().requires_grad_()
            action_logits = torch.cat([logits_proxy.unsqueeze(0), logits[: len(new) - 1]])
        else:
            action_logits = logits[max(first, 0) : len(new) - 1]
        proxies = [t for pair in past for t in pair]
        segment = _Segment(len(new), keys, values, logits[-1], proxies, logits_proxy)
        value = 0.0
        if action:
            loss = self.objective(action_logits, torch.tensor(action, device=self.device), teacher)
            self._backward([loss], None, segment, state, f"trajectory {event.index} turn {event.turn}",
                           retain_graph=True)
            value = float(loss.detach())
        state.segments.append(segment)
        state.ids += new
        return TurnOutcome(value, len(action), len(new))

    def close(self, index: int) -> int:
        state = self.open.pop(index, None)
        if state is None:
            return 0
        replayed = 0
        for position in range(len(state.segments) - 1, -1, -1):
            segment = state.segments[position]
            outputs, adjoints = [], []
            for out, adj in [*zip(segment.keys, segment.key_adjoints), *zip(segment.values, segment.value_adjoints),
                             (segment.last_logits, segment.logits_adjoint)]:
                if adj is not None:
                    outputs.append(out)
                    adjoints.append(adj)
            if outputs:
                self._backward(outputs, adjoints, segment, state, f"trajectory {index} context replay",
                               retain_graph=False, owner=position)
                replayed += segment.length
            state.segments[position] = None  # type: ignore[assignment]  # frees its graph before the next one
        return replayed

    def _backward(self, outputs, adjoints, segment: _Segment, state: _Trajectory, where: str, *, retain_graph: bool,
                  owner: int | None = None) -> None:
        """Back-propagate into parameters and the segment's proxies; route proxy adjoints to earlier segments."""
        extra = [segment.logits_proxy] if segment.logits_proxy is not None else []
        inputs = self.params + segment.past_proxies + extra
        grads = torch.autograd.grad(outputs, inputs, grad_outputs=adjoints, retain_graph=retain_graph,
                                    allow_unused=True)
        n = len(self.params)
        self.grads.add(grads[:n], where)
        earlier = state.segments[:owner] if owner is not None else state.segments
        proxy_grads = grads[n : n + len(segment.past_proxies)]
        for layer in range(len(proxy_grads) // 2):
            key_grad, value_grad = proxy_grads[2 * layer], proxy_grads[2 * layer + 1]
            offset = 0
            for s in earlier:
                span = slice(offset, offset + s.length)
                if key_grad is not None:
                    s.key_adjoints[layer] = _accumulate(s.key_adjoints[layer], key_grad[:, :, span])
                if value_grad is not None:
                    s.value_adjoints[layer] = _accumulate(s.value_adjoints[layer], value_grad[:, :, span])
                offset += s.length
        if extra and grads[-1] is not None:
            earlier[-1].logits_adjoint = _accumulate(earlier[-1].logits_adjoint, grads[-1])
