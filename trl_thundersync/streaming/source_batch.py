"""The last members of one GRPO group learned in one padded pass, their advantages folded in (the learner's
`group_backward`, `GRPOBatchLearner.submit_ready`).

When a group's remaining members are all scored, its μ and σ and so every A_i are fixed numbers, and

    Σ_i A_i ∇S_i^score + Σ_i ∇S_i^free (+ entropy)  =  ∇ [ Σ_i A_i S_i^score + Σ_i S_i^free ]

so one backward per destination (the policy and β·KL terms per bucket, the entropy bonus per TRL micro-batch) replaces
one forward and backward per member. The members run as one right-padded batch: over the group's shared prefix when
it has one (`prefix_batch.py`), else as full sequences through the policy's own batched forward (`logps_fn`, TRL's
`_get_per_token_logps_and_entropies`), which requires them to share their prompt tokens. With right padding and causal
attention no valid position attends to a pad, so every member's log-probs are its own pass's up to FP32 rounding.
Each member's potentials are `TrajectoryBackward.row_potentials`, the terms of its own pass.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

import torch

from ..errors import NonFiniteGradientError
from ..types import Rollout
from .gradient_sinks import FlatGradient, all_finite
from .learner_records import GroupBatch, SourceGradients
from .source import TrajectoryBackward, loss_mask

# (members, A_i or None when unscorable, bucket per member, TRL micro-batch per member) -> what the pass produced, or
# None when the members cannot share one pass (each then runs its own)
GroupBackward = Callable[[Sequence[Rollout], Sequence[float | None], Sequence[int], Sequence[int]], GroupBatch | None]
# (the learner calls it with these four; `max_tokens` is bound by the trainer, `batch_group_max_tokens`)


def group_batch(backward: TrajectoryBackward, rollouts: Sequence[Rollout], advantages: Sequence[float | None],
                buckets: Sequence[int], micro_batches: Sequence[int], max_tokens: int = 2048) -> GroupBatch | None:
    """Members `rollouts` of one group, A_i per member (None: unscorable, no policy term), in padded passes of at most
    `max_tokens` forwarded tokens each (rows × the longest row; at least one row): members of similar length
    together. None: their group's prefix does not fit a member, or (without a prefix) they do not share their
    prompt tokens; nothing has run then."""
    masks = [loss_mask(r, backward.eos_and_pad, backward.mask_truncated).to(backward.device).unsqueeze(0)
             for r in rollouts]
    tokens = [int(m.sum().item()) for m in masks]
    needs = [(a is not None and n > 0, backward.beta != 0.0 and n > 0, backward.entropy_coef is not None and n > 0)
             for a, n in zip(advantages, tokens, strict=True)]
    found: list[dict] = [{} for _ in rollouts]
    rows = [r for r, need in enumerate(needs) if any(need)]  # members with nothing to learn are not forwarded

    def destinations(r: int, potentials: dict[str, torch.Tensor], out: dict) -> None:
        for channel, potential in potentials.items():
            if channel == "score":
                key, potential = ("policy", buckets[r]), potential * advantages[r]
            else:
                key = (channel, buckets[r] if channel == "free" else micro_batches[r])
            out[key] = potential if key not in out else out[key] + potential

    sinks: dict = defaultdict(lambda: FlatGradient(backward.params, backward.device))
    adjoints: dict = {}
    flops: float | None = 0.0
    group = rollouts[0].group
    prefixed = bool(rows) and backward.prefixes is not None and group in backward.prefixes.open
    if prefixed and not backward.prefixes.fits([rollouts[r] for r in rows]):
        return None
    if not prefixed and len({tuple(rollouts[r].prompt_ids) for r in rows}) > 1:
        return None  # (left padding would shift the positions of a shorter prompt)
    lengths = {r: len(rollouts[r].completion_ids) + (0 if prefixed else len(rollouts[r].prompt_ids)) for r in rows}
    chunks = chunk_rows(rows, lengths, max_tokens)
    for chunk in chunks:
        if prefixed:
            def combined(logits: Sequence[torch.Tensor], actions: Sequence[torch.Tensor], chunk=chunk) -> dict:
                out: dict = {}
                for r, row_logits, row_actions in zip(chunk, logits, actions, strict=True):
                    weight = backward.normalization.sequence_weight(tokens[r])
                    objective = backward._row_objective(rollouts[r], masks[r], weight, needs[r], found[r])
                    destinations(r, objective(row_logits, row_actions), out)
                return out

            chunk_adjoints, chunk_flops = backward.prefixes.members([rollouts[r] for r in chunk], combined, sinks)
            for key, adjoint in chunk_adjoints.items():
                adjoints[key] = adjoint if key not in adjoints else adjoints[key] + adjoint
            flops = flops + chunk_flops if flops is not None and chunk_flops is not None else None
        else:
            losses = _full_batch(backward, rollouts, chunk, masks, tokens, needs, found, destinations)
            where = f"group {group} trajectories {[rollouts[r].index for r in chunk]}"
            for n, (key, loss) in enumerate(losses.items()):
                if loss.requires_grad:
                    grads = torch.autograd.grad(loss, backward.params, retain_graph=n + 1 < len(losses),
                                                allow_unused=True)
                    sinks[key].add(grads, f"{where} {key!r}")
    vectors = {key: sink.vector for key, sink in sinks.items()}
    if not all(all_finite(v) for key, v in vectors.items() if key[0] == "policy"):
        raise NonFiniteGradientError(f"group {group}: the batched pass of trajectories "
                                     f"{[rollouts[r].index for r in rows]} produced a non-finite gradient")
    return GroupBatch(tuple(_row(backward, r, m, n, f, any(need))
                            for r, m, n, f, need in zip(rollouts, masks, tokens, found, needs, strict=True)),
                      vectors, adjoints, flops if prefixed else None,
                      tuple(tuple(rollouts[r].index for r in chunk) for chunk in chunks))


def chunk_rows(rows: Sequence[int], lengths: dict[int, int], max_tokens: int) -> list[list[int]]:
    """`rows` in passes of at most `max_tokens` padded tokens (rows × the longest), shortest first, so members of
    similar length share a pass; a row longer than the budget runs alone."""
    chunks: list[list[int]] = []
    for r in sorted(rows, key=lambda r: lengths[r]):
        if chunks and (len(chunks[-1]) + 1) * lengths[r] <= max_tokens:
            chunks[-1].append(r)
        else:
            chunks.append([r])
    return chunks


def _full_batch(backward: TrajectoryBackward, rollouts: Sequence[Rollout], rows: Sequence[int],
                masks: Sequence[torch.Tensor], tokens: Sequence[int], needs: Sequence[tuple[bool, bool, bool]],
                found: Sequence[dict], destinations: Callable) -> dict:
    """Members `rows` as full sequences in one right-padded forward (sharing their prompt tokens): each member's
    potentials from its rows of the batch, combined per destination key."""
    prompt = tuple(rollouts[rows[0]].prompt_ids)
    width = max(len(rollouts[r].completion_ids) for r in rows)
    ids = torch.tensor([[*prompt, *rollouts[r].completion_ids]
                        + [rollouts[r].completion_ids[-1]] * (width - len(rollouts[r].completion_ids)) for r in rows],
                       device=backward.device)
    attention = torch.ones_like(ids)  # right padding is never attended to under causal attention
    entropies = None
    if any(needs[r][2] for r in rows):
        logps, entropies = backward.logps_entropy_fn(ids, attention, width)
    else:
        logps = backward.logps_fn(ids, attention, width)
    reference = None
    if any(needs[r][1] for r in rows):
        with torch.no_grad():
            reference = backward.ref_logps_fn(ids, attention, width)
    out: dict = {}
    for j, r in enumerate(rows):
        n = len(rollouts[r].completion_ids)
        potentials = backward.row_potentials(
            rollouts[r], logps[j : j + 1, :n], entropies[j : j + 1, :n] if entropies is not None else None,
            lambda j=j, n=n: reference[j : j + 1, :n], masks[r], backward.normalization.sequence_weight(tokens[r]),
            needs[r], found[r])
        destinations(r, potentials, out)
    return out


def _row(backward: TrajectoryBackward, rollout: Rollout, mask: torch.Tensor, tokens: int, found: dict,
         ran: bool) -> SourceGradients:
    """A member's scalars, as its own pass would have returned them (no vectors)."""
    ids = torch.tensor([list(rollout.prompt_ids) + list(rollout.completion_ids)], device=backward.device)
    sampling = backward._sampling_stats(rollout, ids, torch.ones_like(ids), len(rollout.completion_ids), mask,
                                        found.get("logps"))
    if not ran:  # as `TrajectoryBackward.gradients`: nothing to learn, no forward
        return SourceGradients(None, None, tokens, sampling=sampling)
    return SourceGradients(None, None, tokens, found.get("free_value", 0.0), found.get("kl_sum", 0.0), None,
                           found.get("entropy_sum", 0.0), found.get("off_policy", 0.0), found.get("value", 0.0),
                           sampling)
