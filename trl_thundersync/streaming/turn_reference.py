"""Reference-model log-probabilities of each turn's action tokens, by incremental no-grad forwards (linear cost).

Each trajectory keeps the reference model's own `DynamicCache`; turn j forwards only the tokens it appended (the
same segment the policy's boundary-cut backward forwards), so the reference costs one pass over the trajectory in
total, as TRL's one full no-grad forward does. Log-probs use TRL's temperature scaling (`add_fused_lm_head`
divides the reference logits by `GRPOConfig.temperature` too):

    ref_t = log_softmax(logits_ref(a_t | history_<t) / temperature)[a_t]        (T,) per turn, no graph
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .segment_backward import action_logits, model_logits, span_rows


@dataclass
class _ReferenceState:
    cache: Any  # the reference model's DynamicCache over every token forwarded so far
    last_logits: torch.Tensor | None = None  # (V,) logits at the last forwarded position


class TurnReference:
    """`action_logps(index, new, n_action)` once per turn in order; `discard(index)` when the trajectory ends."""

    def __init__(self, model: Any, *, temperature: float = 1.0, device: torch.device | str = "cpu",
                 context: Callable[[], contextlib.AbstractContextManager] | None = None) -> None:
        self.model, self.temperature, self.device = model, temperature, torch.device(device)
        self.context = context if context is not None else contextlib.nullcontext  # e.g. PEFT's adapter off
        self.open: dict[int, _ReferenceState] = {}

    def seed(self, index: int, keys: list[torch.Tensor], values: list[torch.Tensor],
             last_logits: torch.Tensor | None) -> None:
        """Start trajectory `index` from a prefix the reference forwarded once for its group
        (`shared_prefix.ReferencePrefix`): its key/values and last logits row. The cache appends by concatenation,
        so the shared tensors are read, never written."""
        from transformers import DynamicCache

        cache = DynamicCache(ddp_cache_data=list(zip(keys, values, strict=True)))
        self.open[index] = _ReferenceState(cache, last_logits)

    def action_logps(self, index: int, new: Sequence[int], n_action: int) -> torch.Tensor:
        """Reference log-probs (n_action,) of the last `n_action` tokens of `new`, the tokens appended by a turn."""
        return self.span_logps(index, new, [(len(new) - n_action, len(new))] if n_action else [])

    @torch.no_grad()
    def span_logps(self, index: int, new: Sequence[int], spans: Sequence[tuple[int, int]]) -> torch.Tensor:
        """Reference log-probs of the tokens of `new` at `spans` ([start, end) positions, in order): the tokens
        appended by one turn, or by several consecutive turns learned as one segment."""
        from transformers import DynamicCache

        state = self.open.setdefault(index, _ReferenceState(DynamicCache()))
        keep = span_rows(len(new), spans)
        with self.context():
            logits = model_logits(self.model, new, self.device, state.cache, keep=keep)
        previous, state.last_logits = state.last_logits, logits[-1].clone()
        if not spans:
            return torch.zeros(0, device=logits.device)
        rows = action_logits(logits, len(new) - keep, spans, previous)
        actions = torch.tensor([new[p] for a, b in spans for p in range(a, b)], device=rows.device, dtype=torch.long)
        logps = torch.log_softmax(rows.float() / self.temperature, dim=-1)
        return logps.gather(-1, actions.unsqueeze(-1)).squeeze(-1)

    def discard(self, index: int) -> None:
        self.open.pop(index, None)

    def held_bytes(self, index: int | None = None) -> int:
        """Bytes of the reference key/value caches (one trajectory, or all)."""
        states = list(self.open.values()) if index is None else [self.open[index]] if index in self.open else []
        total = 0
        for state in states:
            for layer in state.cache.layers:
                for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                    total += t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0
        return total
