"""Several members of one group learned in one padded pass over the group's shared prefix (`shared_prefix.py`).

When the learner takes the last members of a group together (their rewards known, so the group's μ, σ and every
advantage A_i are fixed), their continuations y_i run as one right-padded batch over the prefix's key/values instead of
one pass each. Their objectives are combined *before* the backward, with the weights each would get at the group's
fold (A_i for the policy term, 1 for β·KL and the entropy bonus), so one vector-Jacobian product per destination
(bucket, TRL micro-batch) replaces one per member and channel:

    Σ_i w_i ∇S_i = ∇ (Σ_i w_i S_i)          (S_i: member i's objective, w_i fixed numbers)

Exact up to FP32 rounding: with right padding and causal attention no valid position attends to a pad token, every
row reads the same prefix positions, and a pad position's logits reach no objective. The prefix states enter the
batch once, expanded over the rows, so their adjoint is already the weighted sum of the members' (what
`PrefixAdjoints` would have folded); it goes into the group's prefix backward at its close.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import torch

from .gradient_sinks import GradientSink
from .segment_backward import proxy_cache
from .shared_prefix import GroupPrefix, PassWork, _check_member

# per member: its logits rows (|ids| − prompt_length, V) and tokens → {destination key: weighted objective}
RowsObjective = Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], dict[Hashable, torch.Tensor]]


@dataclass(frozen=True)
class BatchPass:
    """What one padded pass over a group's prefix produced besides the gradients it put into the sinks."""

    adjoints: dict[Hashable, torch.Tensor]  # destination key -> flat FP32 boundary adjoint (weighted sum)
    work: tuple[PassWork, ...]  # the pass as it ran: one row per member, each padded to the longest, over the prefix


def batched_logits(prefix: GroupPrefix, rows: Sequence[Sequence[int]],
                   proxies: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Per member (prompt + completion `rows`, each longer than the prefix), the logits rows predicting its completion
    tokens, as `shared_prefix._member_logits` gives them one at a time; `proxies` are the prefix outputs the batch
    reads (keys per layer, values per layer, then the trailing rows if any)."""
    plan, layers = prefix.plan, len(prefix.keys)
    cut, width = len(plan.ids), max(len(ids) for ids in rows) - len(plan.ids)
    batch = torch.tensor([list(ids[cut:]) + [ids[-1]] * (cut + width - len(ids)) for ids in rows],
                         device=prefix.device)  # right-padded with the row's last token: never attended to
    n = len(rows)
    cache = proxy_cache([(k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1))
                         for k, v in zip(proxies[:layers], proxies[layers : 2 * layers], strict=True)])
    logits = prefix.model(input_ids=batch, **_cache_kwargs(prefix.model, cache)).logits
    trailing = proxies[2 * layers] if prefix.logits is not None else None
    out = []
    for r, ids in enumerate(rows):
        parts = ([trailing] if trailing is not None else []) + [logits[r, : len(ids) - cut - 1]]
        out.append(torch.cat(parts)[: len(ids) - plan.prompt_length])
    return out


def _cache_kwargs(model, cache) -> dict:
    import inspect

    parameters = inspect.signature(getattr(model, "get_base_model", lambda: model)().forward).parameters
    return {"cache" if "cache" in parameters else "past_key_values": cache, "use_cache": True}


def members_pass(prefix: GroupPrefix, indices: Sequence[int], rows: Sequence[Sequence[int]],
                 objective: RowsObjective, sinks: Mapping[Hashable, GradientSink]) -> BatchPass:
    """Members `indices` (their prompt + completion `rows`, each running past the prefix) in one padded pass: per
    destination key of `objective`, its parameter gradient into `sinks[key]` and its boundary adjoint returned."""
    where = f"group {prefix.plan.group} members {list(indices)}"
    if prefix.closed:
        raise RuntimeError(f"{where}: the group's prefix was already back-propagated or discarded")
    for index, ids in zip(indices, rows, strict=True):
        _check_member(prefix.plan, ids, f"group {prefix.plan.group} member {index}")
        if len(ids) <= len(prefix.plan.ids):
            raise ValueError(f"group {prefix.plan.group} member {index} ends inside the prefix: no batched pass")
    proxies = [t.detach().requires_grad_() for t in prefix.outputs]
    logits = batched_logits(prefix, rows, proxies)
    tokens = [torch.tensor(list(ids[prefix.plan.prompt_length :]), device=prefix.device) for ids in rows]
    losses = {key: loss for key, loss in objective(logits, tokens).items() if loss.requires_grad}
    params = prefix.params
    adjoints = {}
    for n, (key, loss) in enumerate(losses.items()):
        grads = torch.autograd.grad(loss, params + proxies, retain_graph=n + 1 < len(losses), allow_unused=True)
        sinks[key].add(grads[: len(params)], f"{where} {key!r}")
        adjoints[key] = prefix.flatten(grads[len(params) :], f"{where} {key!r}")
    cut = len(prefix.plan.ids)
    work = (PassWork(max(len(ids) for ids in rows) - cut, cut, len(losses)),) * len(rows)
    prefix.member_work.extend(work)
    return BatchPass(adjoints, work)
