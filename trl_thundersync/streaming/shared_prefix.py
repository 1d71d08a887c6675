"""Shared-prefix backward of one GRPO group at the frozen θ_k (paper Appendix I, "Shared-prefix backward in all
schedules"): the group's prompt is forwarded and back-propagated once instead of once per member.

Member i of a group is the token sequence x_i = p + y_i, where p (|p| = P tokens) is the prefix all members share
(at least the rendered prompt) and y_i its continuation (C_i tokens). Its objective S_i scores rows of the logits of
x_i at positions ≥ prompt_length − 1 (those predicting the completion). With K, V the prefix's per-layer key/value
states and ℓ its trailing logits rows (those that predict completion tokens inside the prefix, if the prefix runs
past the prompt), the chain rule splits the gradient at the prefix boundary:

    ∇_θ S_i = ∂S_i/∂θ |_(K,V,ℓ fixed)  +  J_pᵀ · a_i,      a_i = ∂S_i/∂(K, V, ℓ)  (the boundary adjoint)

where J_p is the Jacobian of the prefix's outputs (K, V, ℓ) with respect to θ. `GroupPrefix.member` computes the
first term (a forward of y_i over *detached, grad-requiring* copies of K, V, ℓ: the boundary cut of
`segment_backward`) into the caller's sinks and returns a_i per channel. The second term is linear in a_i, so any
weighting of the members' gradients is the same weighting of their adjoints:

    Σ_i A_i ∇S_i = Σ_i A_i ∂S_i/∂θ  +  J_pᵀ (Σ_i A_i a_i)

and Σ_i A_i a_i folds with GRPO's group statistics exactly like the parameter gradients do (`accumulators`:
a_G1 = Σ (R_i − c) a_i, a_G2 = Σ a_i, then (a_G1 − (μ − c) a_G2)·scale when the group closes; `PrefixAdjoints` does
it with `GroupStatistics` over the flat adjoint), or as a plain sum when each member's coefficient was already in its
objective, or held per trajectory until its reward binds. `GroupPrefix.backward` then runs J_pᵀ once per
destination sink with the combined adjoint. Work per group: P + Σ_i C_i token passes instead of Σ_i (P + C_i).

The KL reference model (frozen, no graph) gets the same treatment: `ReferencePrefix` forwards the prefix once and
each member's continuation over its key/values. The work that actually ran is listed as `PassWork` records
(`GroupPrefix.work`: the prefix once, then the continuations with the prefix as cached context); `pass_flops` /
`pass_flop_counter` price them in the learner FLOP ledger's accounting (`streaming.flops`).

Adjoints are flat FP32 vectors of `GroupPrefix.adjoint_size` entries: per layer K then V (1, kv_heads, P, head_dim),
then ℓ (rows, vocab) when the prefix holds scored rows. Same requirements as the boundary cut: a Hugging Face causal
LM with full-attention layers through `DynamicCache`, no activation checkpointing, no dropout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from ..errors import ConfigurationError, NonFiniteGradientError, PrefixMismatchError
from .accumulators import GroupStatistics
from .flops import ModelShape, forward_flops
from .gradient_sinks import GradientSink
from .segment_backward import ChannelObjective, SavedBytes, model_logits, proxy_cache


@dataclass(frozen=True)
class PrefixPlan:
    """Where a group's members are cut: the tokens forwarded once for all of them."""

    group: int  # the group's id, named in errors and fallbacks
    ids: tuple[int, ...]  # the shared prefix tokens (at least one; at least prompt_length − 1)
    prompt_length: int  # |prompt|: logits rows from position prompt_length − 1 on reach the member's objective


@dataclass(frozen=True)
class PrefixFallback:
    """The group runs full per-member passes instead; `reason` says why (for the caller's log line)."""

    group: int  # the group's id
    reason: str  # why its members cannot share a prefix pass


def context_window(model: Any) -> int | None:
    """The model's context length (`max_position_embeddings`), None when its config does not say."""
    config = getattr(model, "config", None)
    return getattr(getattr(config, "text_config", config), "max_position_embeddings", None)


def model_refusal(model: Any) -> str | None:
    """Why this model's groups cannot use a shared-prefix pass exactly (None: they can): activation checkpointing
    drops the retained prefix graph, and a sliding-window (or other non-full) attention layer would not see the
    prefix's key/values through the cache as its full pass does."""
    checkpointing = getattr(model, "is_activation_checkpointing", None)  # transformers ≥ 5.2x; older name below
    if checkpointing is None:
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
    if checkpointing:
        return "activation (gradient) checkpointing is on; it drops the retained prefix graph"
    config = getattr(model, "config", None)
    kinds = set(getattr(getattr(config, "text_config", config), "layer_types", None) or ())
    if kinds - {"full_attention"}:
        return f"attention layer types {sorted(kinds)}: only full-attention layers read a prefix cache exactly"
    return None


def _common_length(members: Sequence[Sequence[int]]) -> int:
    first, length = members[0], min(len(m) for m in members)
    for n in range(length):
        if any(m[n] != first[n] for m in members):
            return n
    return length


def plan_prefix(group: int, members: Sequence[Sequence[int]], prompt_length: int,
                window: int | None = None) -> PrefixPlan | PrefixFallback:
    """The longest common token prefix of all `members` (prompt + completion ids each), cut so that every member keeps
    at least one token after it. Falls back when a member does not carry the first `prompt_length` tokens of the
    others (a rewritten or differently rendered prompt) or when the prefix exceeds the context `window`."""
    if not members:
        return PrefixFallback(group, "the group has no members")
    if prompt_length < 1:
        return PrefixFallback(group, f"prompt_length={prompt_length}: there is no prompt to share")
    shared = _common_length(members)
    if shared < prompt_length:
        return PrefixFallback(group, f"its members share only {shared} leading tokens of a {prompt_length}-token "
                                     "prompt (a prompt rewritten or rendered differently per member)")
    cut = min(shared, min(len(m) for m in members) - 1)
    if cut < 1:
        return PrefixFallback(group, "a member is a single token: there is no prefix to share")
    if window is not None and cut > window:
        return PrefixFallback(group, f"its shared prefix of {cut} tokens exceeds the model's context window "
                                     f"({window})")
    return PrefixPlan(group, tuple(members[0][:cut]), prompt_length)


def prompt_plan(group: int, prompt_ids: Sequence[int], window: int | None = None) -> PrefixPlan | PrefixFallback:
    """The cut at the rendered prompt, known when the group starts (streaming: members arrive one by one, so the
    prefix is fixed before their tokens are); each member is checked against it in `GroupPrefix.member`."""
    if not prompt_ids:
        return PrefixFallback(group, "an empty prompt: there is no prefix to share")
    if window is not None and len(prompt_ids) > window:
        return PrefixFallback(group, f"its prompt of {len(prompt_ids)} tokens exceeds the model's context window "
                                     f"({window})")
    return PrefixPlan(group, tuple(prompt_ids), len(prompt_ids))


# -- work accounting ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PassWork:
    """One forward actually run by the learner, and the backward products through its graph."""

    tokens: int  # tokens forwarded
    cached: int  # tokens before them, attended through the key/value cache (0: a pass from the start)
    backwards: int  # vector-Jacobian products through this pass's graph (one per channel or sink that used it)


def pass_flops(shape: ModelShape, work: PassWork, lora_adapter_params: int | None = None) -> float:
    """Learner FLOPs of one pass in `streaming.flops`' accounting: the forward of `tokens` plus their attention to
    `cached` tokens (2·2·tokens·cached per head dim and layer), and per backward product 2× the forward (full
    fine-tuning; LoRA: 1× plus the adapters'). With cached = 0 and one backward this is `learner_flops`."""
    forward = forward_flops(shape, work.tokens)
    forward += shape.layers * 2 * 2 * work.tokens * work.cached * shape.heads * shape.head_dim
    if lora_adapter_params is None:
        return forward * (1 + 2 * work.backwards)
    return forward * (1 + work.backwards) + 2.0 * work.tokens * lora_adapter_params * (1 + 2 * work.backwards)


def full_pass_work(lengths: Sequence[int], backwards: int = 1) -> list[PassWork]:
    """The passes of the reference without a shared prefix: every member forwarded over its whole sequence."""
    return [PassWork(n, 0, backwards) for n in lengths]


def pass_flop_counter(model: Any, trainable: Iterable[torch.nn.Parameter]) -> Callable[[PassWork], float] | None:
    """`pass_flops` bound to a policy's shapes, as `streaming.flops.model_flop_counter` binds `learner_flops` (PEFT
    adapter: the `trainable` parameters are the adapter's); None for a config that is not a standard decoder's."""
    adapter = sum(p.numel() for p in trainable) if hasattr(model, "peft_config") else None
    try:
        shape = ModelShape.from_config(getattr(model, "config", None))
    except AttributeError:
        return None
    return partial(pass_flops, shape, lora_adapter_params=adapter)


# -- the group's prefix pass -------------------------------------------------------------------------------------------
def _prefix_forward(model: Any, plan: PrefixPlan, device: torch.device) -> tuple[list, list, torch.Tensor | None]:
    """Per-layer keys and values (1, kv_heads, P, head_dim) of the prefix, and its trailing logits rows that predict
    completion tokens (positions prompt_length − 1 … P − 1; None when the prefix ends before the completion)."""
    rows = max(0, len(plan.ids) - plan.prompt_length + 1)
    cache = proxy_cache([])
    logits = model_logits(model, plan.ids, device, cache, keep=max(rows, 1))
    return ([layer.keys for layer in cache.layers], [layer.values for layer in cache.layers],
            logits[-rows:] if rows else None)


def _member_logits(model: Any, plan: PrefixPlan, device: torch.device, keys: Sequence[torch.Tensor],
                   values: Sequence[torch.Tensor], rows: torch.Tensor | None, ids: Sequence[int]) -> torch.Tensor:
    """Logits (|ids| − prompt_length, V) predicting ids[prompt_length:]: the prefix's trailing rows, then a forward
    of the continuation ids[P:] over the prefix's keys/values (as given: proxies, or a frozen model's own)."""
    cut = len(plan.ids)
    parts = [rows] if rows is not None else []
    if len(ids) > cut:
        cache = proxy_cache(list(zip(keys, values, strict=True)))
        parts.append(model_logits(model, ids[cut:], device, cache, keep=len(ids) - cut)[:-1])
    return torch.cat(parts)[: len(ids) - plan.prompt_length]


def _check_member(plan: PrefixPlan, ids: Sequence[int], where: str) -> None:
    if tuple(ids[: len(plan.ids)]) != plan.ids:
        raise PrefixMismatchError(f"{where}: its tokens do not start with the group's {len(plan.ids)}-token shared "
                                  "prefix; run its full pass instead")


@dataclass(frozen=True)
class MemberPass:
    """What one member's continuation pass produced besides the parameter gradients it put into the sinks."""

    values: dict[str, float]  # channel -> value of its loss (before any normalization)
    scored_rows: int  # logits rows handed to the objective: |member| − prompt_length
    forwarded_tokens: int  # continuation tokens run through the model (0: nothing to score, nothing run)
    adjoints: dict[str, torch.Tensor]  # channel -> flat FP32 boundary adjoint (adjoint_size,)


class GroupPrefix:
    """One group's prefix at θ_k: forwarded on construction, graph retained until `backward` (or `discard`)."""

    def __init__(self, model: Any, params: Sequence[torch.Tensor], plan: PrefixPlan,
                 device: torch.device | str = "cpu") -> None:
        if not plan.ids or len(plan.ids) < plan.prompt_length - 1:
            raise ValueError(f"group {plan.group}: a prefix of {len(plan.ids)} tokens cannot feed the logits row "
                             f"before a {plan.prompt_length}-token prompt's completion")
        refusal = model_refusal(model)
        if refusal is not None:
            raise ConfigurationError(f"group {plan.group}: no shared-prefix pass: {refusal}; use full passes")
        self.model, self.params, self.plan, self.device = model, list(params), plan, torch.device(device)
        saved = SavedBytes({p.untyped_storage().data_ptr() for p in self.params})
        with saved.hooks():
            # per layer (1, kv_heads, P, head_dim), and the trailing rows (rows, V) or None; graph-attached
            self.keys, self.values, self.logits = _prefix_forward(model, plan, self.device)
        if self.logits is not None:
            saved.pack(self.logits)  # held by the trailing rows even where no operation saved it
        self.saved_bytes = saved.total  # what the retained graph holds (activations), parameters excluded
        self.member_work: list[PassWork] = []  # the members' continuation passes run so far
        self.prefix_backwards = 0  # backward products run through the prefix (at `backward`)
        self.closed = False

    @property
    def outputs(self) -> list[torch.Tensor]:
        """The prefix's outputs a member reads, in adjoint order: K per layer, V per layer, then ℓ if any."""
        return [*self.keys, *self.values, *([self.logits] if self.logits is not None else [])]

    @property
    def work(self) -> list[PassWork]:
        """Every pass this group ran: the prefix's (forwarded once) and its members' continuations."""
        return [PassWork(len(self.plan.ids), 0, self.prefix_backwards), *self.member_work]

    @property
    def adjoint_size(self) -> int:
        return sum(t.numel() for t in self.outputs)

    def held_bytes(self) -> int:
        """Bytes this open group retains: the prefix graph's saved tensors (the caller holds the adjoints,
        4·adjoint_size bytes each)."""
        return 0 if self.closed else self.saved_bytes

    def member(self, index: int, ids: Sequence[int], objective: ChannelObjective,
               sinks: Mapping[str, GradientSink]) -> MemberPass:
        """Member `index` (its prompt + completion `ids`): its continuation over the prefix's detached states; per
        channel, ∂S/∂θ into `sinks[channel]` and the boundary adjoint returned. The objective gets the logits rows
        (|ids| − prompt_length, V) predicting ids[prompt_length:], and those tokens."""
        plan, where = self.plan, f"group {self.plan.group} member {index}"
        if self.closed:
            raise RuntimeError(f"{where}: the group's prefix was already back-propagated or discarded")
        _check_member(plan, ids, where)
        cut, scored = len(plan.ids), len(ids) - plan.prompt_length
        if scored <= 0:
            return MemberPass({}, 0, 0, {})
        proxies = [t.detach().requires_grad_() for t in self.outputs]
        layers = len(self.keys)
        logits = _member_logits(self.model, plan, self.device, proxies[:layers], proxies[layers : 2 * layers],
                                proxies[2 * layers] if self.logits is not None else None, ids)
        tokens = torch.tensor(list(ids[plan.prompt_length :]), device=self.device)
        losses = {c: loss for c, loss in objective(logits, tokens).items() if loss.requires_grad}
        adjoints = {}
        for n, (channel, loss) in enumerate(losses.items()):
            grads = torch.autograd.grad(loss, self.params + proxies, retain_graph=n + 1 < len(losses),
                                        allow_unused=True)
            sinks[channel].add(grads[: len(self.params)], where)
            adjoints[channel] = self._flat(grads[len(self.params) :], f"{where} channel {channel!r}")
        if len(ids) > cut:  # (a member ending inside the prefix reads its trailing rows only: no pass)
            self.member_work.append(PassWork(len(ids) - cut, cut, len(losses)))
        return MemberPass({c: float(v.detach()) for c, v in losses.items()}, scored, len(ids) - cut, adjoints)

    def backward(self, adjoints: Mapping[Hashable, torch.Tensor | None],
                 sinks: Mapping[Hashable, GradientSink]) -> int:
        """J_pᵀ · adjoint into `sinks[key]`, once per combined adjoint (None or absent: nothing for that sink; keys
        as `PrefixAdjoints.fold` gives them, or channel names), then frees the prefix graph. Returns the prefix
        tokens back-propagated (0 when nothing was)."""
        where = f"group {self.plan.group} shared prefix"
        if self.closed:
            raise RuntimeError(f"{where}: already back-propagated or discarded")
        todo = [(name, a) for name, a in adjoints.items() if a is not None]
        for name, adjoint in todo:
            if not bool(torch.isfinite(adjoint).all()):
                self.discard()
                raise NonFiniteGradientError(f"{where}: the combined boundary adjoint for {name!r} is not finite; "
                                             "refusing to propagate it")
        outputs = self.outputs
        # an output no trainable parameter reaches (LoRA on some projections only: a layer's keys from a frozen
        # k_proj over frozen inputs) carries its adjoint nowhere
        live = [out.requires_grad for out in outputs]
        for n, (name, adjoint) in enumerate(todo):
            pairs = [(out, piece.view_as(out).to(out.dtype)) for piece, out, used in
                     zip(adjoint.split([o.numel() for o in outputs]), outputs, live, strict=True) if used]
            if not pairs:
                continue
            grads = torch.autograd.grad([out for out, _ in pairs], self.params, grad_outputs=[p for _, p in pairs],
                                        retain_graph=n + 1 < len(todo), allow_unused=True)
            sinks[name].add(grads, where)
        self.prefix_backwards = len(todo)
        self.discard()
        return len(self.plan.ids) if todo else 0

    def discard(self) -> None:
        """Free the prefix graph without back-propagating it (an aborted batch, or a group with nothing to fold)."""
        self.keys, self.values, self.logits, self.closed = [], [], None, True

    def flatten(self, grads: Sequence[torch.Tensor | None], where: str) -> torch.Tensor:
        """Adjoints of `outputs` (None: zero) as one flat FP32 vector; raises on a non-finite entry."""
        return self._flat(grads, where)

    def _flat(self, grads: Sequence[torch.Tensor | None], where: str) -> torch.Tensor:
        pieces = [torch.zeros(out.numel(), dtype=torch.float32, device=out.device) if g is None
                  else g.reshape(-1).to(torch.float32) for g, out in zip(grads, self.outputs, strict=True)]
        flat = torch.cat(pieces)
        if not bool(torch.isfinite(flat).all()):
            raise NonFiniteGradientError(f"{where}: non-finite boundary adjoint; refusing to accumulate it")
        return flat


class PrefixAdjoints:
    """One group's boundary adjoints, folded with the algebra of its parameter gradients (`GroupStatistics`).

    Score channel (advantage-weighted): a_G1 = Σ (R_i − c) a_i and a_G2 = Σ a_i per bucket, fixed into
    (a_G1 − (μ − c) a_G2)·scale by `fold` when the group's rewards are; an unscorable member (NaN reward) enters μ and
    σ as nothing, exactly as for H_i. Under content release a member's score adjoint is `hold`-en until its reward
    `bind`s it. Advantage-free channels (β·KL, entropy) are plain sums per key (bucket, entropy micro-batch)."""

    def __init__(self, group: int, size: int, adjoint_size: int, score: str = "score") -> None:
        self.group, self.score_channel = group, score
        self.score = GroupStatistics(group, size, adjoint_size)  # a_G1, a_G2 per bucket (flat, FP32)
        self.sums: dict[tuple[str, Hashable], torch.Tensor] = {}  # (channel, key) -> Σ a_i
        self.held: dict[int, torch.Tensor | None] = {}  # trajectory -> its score adjoint, until its reward binds

    def add(self, reward: float, adjoint: torch.Tensor | None, bucket: int = 0) -> None:
        """A member whose reward is known (None: it had no score adjoint, e.g. no scored tokens)."""
        self.score.add(reward, adjoint, bucket)

    def hold(self, index: int, adjoint: torch.Tensor | None) -> None:
        self.held[index] = adjoint

    def bind(self, index: int, reward: float, bucket: int = 0) -> None:
        if index not in self.held:
            raise KeyError(f"group {self.group}: trajectory {index} holds no boundary adjoint to bind")
        self.add(reward, self.held.pop(index), bucket)

    def add_free(self, channel: str, adjoint: torch.Tensor, key: Hashable = 0) -> None:
        slot = self.sums.get((channel, key))
        self.sums[(channel, key)] = adjoint.clone() if slot is None else slot.add_(adjoint)

    def fold(self, scale: float) -> dict[tuple[str, Hashable], torch.Tensor]:
        """(channel, key) -> combined adjoint for `GroupPrefix.backward`: the score channel's per bucket with
        A_i = (R_i − μ)·scale (nothing for a non-finite scale, as `GroupStatistics.fold`), then the sums."""
        if self.held:
            raise ValueError(f"group {self.group}: trajectories {sorted(self.held)} hold adjoints without a reward")
        folded = {(self.score_channel, b): a for b, a in self.score.fold(scale).items()}
        return {**folded, **self.sums}

    def nbytes(self) -> int:
        held = sum(a.numel() * 4 for a in self.held.values() if a is not None)
        return self.score.nbytes() + held + sum(a.numel() * 4 for a in self.sums.values())


class ReferencePrefix:
    """A frozen scorer's (the KL reference model's) forward of the group's prefix, run once without a graph;
    `logits(ids)` gives a member's rows as its own full forward would, forwarding only the continuation. `context`
    wraps each forward (PEFT: the policy with its adapter disabled)."""

    def __init__(self, model: Any, plan: PrefixPlan, device: torch.device | str = "cpu",
                 context: Callable[[], contextlib.AbstractContextManager] | None = None) -> None:
        self.model, self.plan, self.device = model, plan, torch.device(device)
        self.context = context if context is not None else contextlib.nullcontext
        with torch.no_grad(), self.context():
            self.keys, self.values, self.rows = _prefix_forward(model, plan, self.device)
        self.member_work: list[PassWork] = []  # continuation forwards run so far (no backward)

    @property
    def work(self) -> list[PassWork]:
        return [PassWork(len(self.plan.ids), 0, 0), *self.member_work]

    def held_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in [*self.keys, *self.values, self.rows] if t is not None)

    @torch.no_grad()
    def logits(self, index: int, ids: Sequence[int]) -> torch.Tensor:
        """Logits (|ids| − prompt_length, V) predicting member `index`'s completion tokens ids[prompt_length:]."""
        _check_member(self.plan, ids, f"group {self.plan.group} member {index} (reference)")
        if len(ids) <= self.plan.prompt_length:
            return torch.empty(0, self.model.get_output_embeddings().weight.shape[0], device=self.device)
        with self.context():
            out = _member_logits(self.model, self.plan, self.device, self.keys, self.values, self.rows, ids)
        if len(ids) > len(self.plan.ids):
            self.member_work.append(PassWork(len(ids) - len(self.plan.ids), len(self.plan.ids), 0))
        return out
