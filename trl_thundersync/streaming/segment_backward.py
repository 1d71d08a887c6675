"""Per-turn backward of a growing token history at the frozen θ_k, shared by the GRPO and distillation learners.

A trajectory's turn j is conditioned on context_j (prompt, earlier actions, observations) and scores action_j. Its
objective may produce several named loss *channels* (distillation: one; GRPO: the advantage-weighted "score" and the
advantage-free "free" term), each accumulating into its own gradient sink, so that channel c's sink ends up with
exactly ∇ Σ_j L_j^c, the gradient a full forward/backward of channel c alone would give.

`FullContext` (the naive reference): forward over context_j + action_j, backward through all of it. Turn j re-runs
turns 0..j−1, so a trajectory of n turns costs Σ_j |context_j| ≈ O(n²) token passes.

`BoundaryCut` (paper Appendix I, "deferred state adjoints"): segment j is what turn j appended (the observation
framing since turn j−1, then action_j; segment 0 starts with the prompt).

    turn j:  forward segment j only, over the key/value states of segments < j given as *detached proxies that
             require grad* (and, if segment j starts with its action, the previous segment's last logits row as a
             proxy too); per channel, backward the turn loss → parameter gradients into that channel's sink now, plus
             adjoints ∂L^c/∂proxy, added into channel c's adjoint buffers of the earlier segments they came from.
             Segment j's graph is retained: its own key/values feed later turns.
    close:   for j = n−1 … 0 and each channel, backward segment j's retained outputs (key/values, last logits) with
             the channel's adjoints later turns sent them → that channel's sink, and channel adjoints for segments < j.
             Then everything is freed.

Gradients are linear in the loss, so keeping the adjoints per channel separates the channels exactly. Every segment
is forwarded once and back-propagated 1 + (number of channels) times at most, so the cost is linear in the trajectory
length. Needs a Hugging Face causal LM with a `DynamicCache`-compatible attention (full attention layers) and no
activation checkpointing (it would drop the retained key/value graphs).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import TurnOrderError
from ..types import TurnEvent
from .gradient_sinks import GradientSink

# (logits (T, V) at the T action positions, graph-attached; actions (T,)) -> {channel: scalar loss summed over tokens}
ChannelObjective = Callable[[torch.Tensor, torch.Tensor], Mapping[str, torch.Tensor]]


@dataclass(frozen=True)
class SegmentOutcome:
    values: dict[str, float]  # channel -> Σ_t of its per-token loss value (before any normalization)
    scored_tokens: int  # |action_j|
    forwarded_tokens: int  # tokens run through the model for this turn (the work it cost)


def model_logits(model: Any, ids: Sequence[int], device: torch.device, cache=None, keep: int = 0) -> torch.Tensor:
    """Logits (keep, V) of the last `keep` positions of `ids` (all positions when keep is 0), through `cache`."""
    # a PEFT wrapper's forward takes **kwargs and hands them to the wrapped model: read the wrapped model's signature
    parameters = inspect.signature(getattr(model, "get_base_model", lambda: model)().forward).parameters
    # transformers renamed `past_key_values` to `cache`; pass whichever this version's forward takes
    name = "cache" if "cache" in parameters else "past_key_values"
    kwargs: dict[str, Any] = {name: cache, "use_cache": True} if cache is not None else {"use_cache": False}
    if keep and "logits_to_keep" in parameters:  # the LM head only where rows are used (long observations)
        kwargs["logits_to_keep"] = keep
    logits = model(input_ids=torch.tensor([list(ids)], device=device), **kwargs).logits[0]
    return logits[-keep:] if keep else logits


def proxy_cache(layers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """A `DynamicCache` over per-layer (keys, values) of earlier tokens, each (1, kv_heads, length, head_dim); empty
    when `layers` is. Pass detached leaves that require grad: a forward through the cache then leaves their adjoints
    in `autograd.grad(..., inputs=leaves)` (the boundary cut), while their storage is shared, not copied."""
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=list(layers)) if layers else DynamicCache()


def span_rows(n_new: int, spans: Sequence[tuple[int, int]]) -> int:
    """Trailing logits rows of a segment of `n_new` tokens needed for actions at `spans` ([start, end) positions):
    from the row before the first action on (that row predicts it), at least the last row."""
    if not spans:
        return 1
    return n_new - spans[0][0] + 1 if spans[0][0] > 0 else n_new


def action_logits(logits: torch.Tensor, offset: int, spans: Sequence[tuple[int, int]],
                  previous: torch.Tensor | None) -> torch.Tensor:
    """The rows predicting the tokens at `spans`, in order: `logits` holds the rows of positions offset, offset+1, …
    (row p predicts token p + 1); `previous` (V,) is the row before the segment, predicting its first token."""
    parts = []
    for start, end in spans:
        if start == 0:
            parts.append(previous.unsqueeze(0))
            parts.append(logits[: end - 1 - offset])
        else:
            parts.append(logits[start - 1 - offset : end - 1 - offset])
    return torch.cat(parts)


class FullContext:
    """Reference: every turn re-runs its whole context (quadratic); no state between turns."""

    def __init__(self, model: Any, params: Sequence[torch.Tensor], device: torch.device | str = "cpu") -> None:
        self.model, self.params, self.device = model, list(params), torch.device(device)
        self.open: dict[int, Any] = {}

    def turn(self, event: TurnEvent, objective: ChannelObjective, sinks: Mapping[str, GradientSink],
             where: str) -> SegmentOutcome:
        context, action = list(event.context_ids), list(event.action_ids)
        if not action:
            return SegmentOutcome({}, 0, 0)
        logits = model_logits(self.model, context + action, self.device, keep=len(action) + 1)[:-1]
        losses = {c: loss for c, loss in objective(logits, torch.tensor(action, device=self.device)).items()
                  if loss.requires_grad}
        for n, (channel, loss) in enumerate(losses.items()):
            grads = torch.autograd.grad(loss, self.params, retain_graph=n + 1 < len(losses), allow_unused=True)
            sinks[channel].add(grads, where)
        return SegmentOutcome({c: float(v.detach()) for c, v in losses.items()}, len(action),
                              len(context) + len(action))

    def close(self, index: int, sinks: Mapping[str, GradientSink], boundary: dict | None = None) -> int:
        return 0

    def discard(self, index: int) -> None:
        return None

    def held_bytes(self, index: int | None = None) -> int:
        return 0


@dataclass
class _Adjoints:
    """One channel's adjoints of a segment's retained outputs, sent back by later turns."""

    keys: list[torch.Tensor | None]
    values: list[torch.Tensor | None]
    logits: torch.Tensor | None = None

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in [*self.keys, *self.values, self.logits] if t is not None)


@dataclass
class _Segment:
    """One turn's appended tokens with their retained graph and, per channel, the adjoints later turns sent back."""

    length: int
    keys: list[torch.Tensor]  # per layer (1, kv_heads, length, head_dim), graph-attached
    values: list[torch.Tensor]
    last_logits: torch.Tensor  # (V,) logits at the segment's last position, graph-attached
    past_proxies: list[torch.Tensor]  # per segment < this one, per layer: K, V (detached leaves over its storage)
    logits_proxy: torch.Tensor | None  # previous segment's last logits, when this segment started with its action
    saved_bytes: int = 0  # tensors its retained graph holds (activations, key/value copies), parameters excluded
    adjoints: dict[str, _Adjoints] = field(default_factory=dict)
    external: bool = False  # a seeded prefix (`BoundaryCut.seed`): its graph is its owner's, its adjoints go back

    def channel(self, name: str) -> _Adjoints:
        if name not in self.adjoints:
            self.adjoints[name] = _Adjoints([None] * len(self.keys), [None] * len(self.values))
        return self.adjoints[name]

    def pending(self, name: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(retained outputs, their adjoints) of one channel, where a later turn sent one."""
        adj = self.adjoints[name]
        pairs = [*zip(self.keys, adj.keys, strict=True), *zip(self.values, adj.values, strict=True),
                 (self.last_logits, adj.logits)]
        pairs = [(out, a) for out, a in pairs if a is not None]
        return [out for out, _ in pairs], [a for _, a in pairs]


@dataclass
class _History:
    ids: list[int] = field(default_factory=list)  # every token forwarded so far
    segments: list[_Segment] = field(default_factory=list)


class SavedBytes:
    """Autograd saved-tensor hooks that measure what a forward's graph retains (unique storages, parameters out)."""

    def __init__(self, exclude: set[int]) -> None:
        self.exclude, self.seen = exclude, {}

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.exclude:
            self.seen[storage.data_ptr()] = storage.nbytes()
        return tensor.detach()  # no grad_fn: returning the tensor itself would make an output's node a cycle

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda tensor: tensor)

    @property
    def total(self) -> int:
        return sum(self.seen.values())


def _accumulate(slot: torch.Tensor | None, grad: torch.Tensor | None) -> torch.Tensor | None:
    if grad is None:
        return slot
    return grad.clone() if slot is None else slot.add_(grad)


class BoundaryCut:
    """Linear-cost per-turn backward with per-channel deferred state adjoints; see the module docstring."""

    def __init__(self, model: Any, params: Sequence[torch.Tensor], device: torch.device | str = "cpu") -> None:
        self.model, self.params, self.device = model, list(params), torch.device(device)
        self.open: dict[int, _History] = {}
        self._param_storages = {p.untyped_storage().data_ptr() for p in self.params}
        # the last `close`'s backward products: (segment tokens, tokens before it, channels replayed) per segment
        self.replay_work: list[tuple[int, int, int]] = []

    def seed(self, index: int, ids: Sequence[int], keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor],
             last_logits: torch.Tensor | None) -> None:
        """Start trajectory `index`'s history with a prefix computed elsewhere (a GRPO group's shared prompt,
        `shared_prefix.GroupPrefix`): its per-layer keys/values (1, kv_heads, len(ids), head_dim) and the logits row
        at its last position (V,) (None: no turn starts with its action right after it), graph-attached to their
        owner's graph. Turns read them as proxies like any segment's; `close` does not back-propagate them but
        returns, per channel, the adjoints the turns sent them (in `boundary`), for the owner to propagate once."""
        if index in self.open:
            raise TurnOrderError(f"trajectory {index}: a prefix seeds a history only before its first turn")
        logits = last_logits if last_logits is not None else torch.zeros(0)
        segment = _Segment(len(ids), list(keys), list(values), logits, [], None, external=True)
        self.open[index] = _History(list(ids), [segment])

    def turn(self, event: TurnEvent, objective: ChannelObjective, sinks: Mapping[str, GradientSink],
             where: str) -> SegmentOutcome:
        return self.turns([event], objective, sinks, where)

    def turns(self, events: Sequence[TurnEvent], objective: ChannelObjective, sinks: Mapping[str, GradientSink],
              where: str) -> SegmentOutcome:
        """Consecutive turns of one trajectory as one segment (one forward, one backward per channel): the tokens
        from the end of the history to the last turn's action. The objective gets the logits rows predicting every
        turn's action tokens, in order, and those tokens; per-token objectives (sums over tokens) give exactly the
        sum of the turns' losses, so coalescing ready turns changes the rounding only."""
        first, last = events[0], events[-1]
        state = self.open.setdefault(first.index, _History())
        if list(first.context_ids[: len(state.ids)]) != state.ids:
            raise TurnOrderError(
                f"trajectory {first.index} turn {first.turn}: its context does not extend the tokens of the earlier "
                "turns; the boundary-cut backward needs an append-only token history (tokens in, tokens out)"
            )
        new = list(last.context_ids[len(state.ids) :]) + list(last.action_ids)
        spans = self._spans(events, state.ids + new, len(state.ids))
        if not new:
            return SegmentOutcome({}, 0, 0)
        if spans and spans[0][0] == 0 and not state.segments:
            raise TurnOrderError(f"trajectory {first.index} turn {first.turn}: an action with an empty context")
        # one leaf per earlier segment and layer, sharing that segment's storage (no copy of the prefix)
        proxies = [t.detach().requires_grad_() for s in state.segments for pair in zip(s.keys, s.values, strict=True)
                   for t in pair]
        saved = SavedBytes(self._param_storages)
        with saved.hooks():
            width = 2 * len(state.segments[0].keys) if proxies else 0
            cache = proxy_cache([(torch.cat(proxies[2 * layer :: width], dim=-2),
                                  torch.cat(proxies[2 * layer + 1 :: width], dim=-2)) for layer in range(width // 2)])
            keep = span_rows(len(new), spans)
            logits = model_logits(self.model, new, self.device, cache, keep=keep)
            start = len(state.ids)
            keys = [layer.keys[:, :, start:] for layer in cache.layers]
            values = [layer.values[:, :, start:] for layer in cache.layers]
            logits_proxy = None
            if spans and spans[0][0] == 0:  # the action starts the segment: the last one predicts its first token
                if state.segments[-1].last_logits.numel() == 0:
                    raise TurnOrderError(f"trajectory {first.index} turn {first.turn}: an action right after a seeded "
                                         "prefix that came without its last logits row")
                logits_proxy = state.segments[-1].last_logits.detach().requires_grad_()
            losses = {}
            if spans:
                rows = action_logits(logits, len(new) - keep, spans, logits_proxy)
                tokens = torch.tensor([new[p] for a, b in spans for p in range(a, b)], device=self.device)
                losses = {c: loss for c, loss in objective(rows, tokens).items() if loss.requires_grad}
        saved.pack(logits)  # held by the segment's last-logits row even where no operation saved it
        segment = _Segment(len(new), keys, values, logits[-1], proxies, logits_proxy, saved.total)
        for channel, loss in losses.items():
            self._backward([loss], None, segment, state, channel, sinks[channel], where, retain_graph=True)
        state.segments.append(segment)
        state.ids += new
        return SegmentOutcome({c: float(v.detach()) for c, v in losses.items()}, sum(b - a for a, b in spans),
                              len(new))

    @staticmethod
    def _spans(events: Sequence[TurnEvent], tokens: list[int], history: int) -> list[tuple[int, int]]:
        """[start, end) of each non-empty action in the segment (positions after the `history` tokens); every turn's
        context + action must be a prefix of the segment's `tokens`."""
        spans = []
        for event in events:
            end = len(event.context_ids) + len(event.action_ids)
            if (event.index != events[0].index or len(event.context_ids) < history
                    or list(event.context_ids) + list(event.action_ids) != tokens[:end]):
                raise TurnOrderError(f"trajectory {events[0].index} turn {event.turn}: coalesced turns must extend one "
                                     "another's tokens (one trajectory, in order)")
            if event.action_ids:
                spans.append((len(event.context_ids) - history, end - history))
        return spans

    def close(self, index: int, sinks: Mapping[str, GradientSink],
              boundary: dict[str, list[torch.Tensor | None]] | None = None) -> int:
        """Replay the deferred adjoints of trajectory `index` into each channel's sink; returns the tokens replayed.
        A seeded prefix is not replayed: `boundary[channel]` gets the adjoints of its outputs instead (keys per
        layer, values per layer, then the last logits row; None where no turn read one)."""
        state = self.open.pop(index, None)
        self.replay_work = []
        if state is None:
            return 0
        replayed = 0
        starts = [0]
        for s in state.segments[:-1]:
            starts.append(starts[-1] + s.length)
        for position in range(len(state.segments) - 1, -1, -1):
            segment = state.segments[position]
            if segment.external:
                if boundary is None:
                    raise ValueError(f"trajectory {index}: its history starts with a seeded prefix; pass `boundary` "
                                     "to receive that prefix's adjoints")
                for channel, adj in segment.adjoints.items():
                    boundary[channel] = [*adj.keys, *adj.values, adj.logits]
                continue
            channels = [c for c in segment.adjoints if segment.pending(c)[0]]
            for n, channel in enumerate(channels):
                outputs, adjoints = segment.pending(channel)
                self._backward(outputs, adjoints, segment, state, channel, sinks[channel],
                               f"trajectory {index} context replay", retain_graph=n + 1 < len(channels),
                               owner=position)
            replayed += segment.length if channels else 0
            if channels:
                self.replay_work.append((segment.length, starts[position], len(channels)))
            state.segments[position] = None  # type: ignore[assignment]  # frees its graph before the next one
        return replayed

    def discard(self, index: int) -> None:
        """Drop a trajectory's retained graphs and adjoints without replaying them."""
        self.open.pop(index, None)

    def held_bytes(self, index: int | None = None) -> int:
        """Bytes retained for open trajectories (one, or all): graph-saved tensors plus deferred adjoints."""
        if index is None:
            states = list(self.open.values())
        else:
            states = [self.open[index]] if index in self.open else []
        return sum(s.saved_bytes + sum(a.nbytes() for a in s.adjoints.values())
                   for state in states for s in state.segments if s is not None)  # (a seeded prefix: adjoints only)

    def _backward(self, outputs, adjoints, segment: _Segment, state: _History, channel: str, sink: GradientSink,
                  where: str, *, retain_graph: bool, owner: int | None = None) -> None:
        """Back-propagate one channel into parameters and the segment's proxies; route proxy adjoints earlier."""
        extra = [segment.logits_proxy] if segment.logits_proxy is not None else []
        inputs = self.params + segment.past_proxies + extra
        grads = torch.autograd.grad(outputs, inputs, grad_outputs=adjoints, retain_graph=retain_graph,
                                    allow_unused=True)
        n = len(self.params)
        sink.add(grads[:n], where)
        earlier = state.segments[:owner] if owner is not None else state.segments
        proxy_grads = iter(grads[n : n + len(segment.past_proxies)])
        for s in earlier[: len(segment.past_proxies) // (2 * len(segment.keys))]:
            adj = s.channel(channel)
            for layer in range(len(s.keys)):
                adj.keys[layer] = _accumulate(adj.keys[layer], next(proxy_grads))
                adj.values[layer] = _accumulate(adj.values[layer], next(proxy_grads))
        if extra and grads[-1] is not None:
            adj = earlier[-1].channel(channel)
            adj.logits = _accumulate(adj.logits, grads[-1])
