"""TRL 1.16's MoE load-balancing auxiliary loss, streamed exactly: one deferred backward per TRL micro-batch.

TRL adds `coef · aux_b / GA` to the loss of every micro-batch b (`GRPOTrainer._compute_loss`), where aux_b is the
`aux_loss` the fused LM head returns for the whole micro-batch (one forward chunk: `_get_per_token_logps_and_entropies`
with `batch_size=None`), i.e. transformers' Mixtral `load_balancing_loss_func` over the router logits of every layer,
masked by the attention mask (prompt + completion, padding and masked truncated completions excluded):

    aux_b = E · Σ_e f_e · P_e,    f_e = C_e / (L·N_b),   P_e = S_e / (L·N_b)
    C_e = Σ_{l,t} m_t [e ∈ top-k(p_lt)]   (no gradient: top-k indices),   S_e = Σ_{l,t} m_t p_lte
    ∇aux_b = E / (L·N_b)² · Σ_e C_e ∇S_e

(E experts, L MoE layers, N_b attended tokens of the micro-batch, p_lt the router softmax of token t in layer l).
The gradient flows only through S_e, a sum over the micro-batch's sequences, but its weights C_e and N_b are totals
over the whole micro-batch: a sequence's router gradient is weighted by the expert counts of every other member.
So the term is not separable per sequence: streaming it per trajectory would need one parameter-sized buffer per
expert and micro-batch (Σ_{i∈b} ∇S_ie for every e). Instead it is deferred per micro-batch: TRL's micro-batch
partition of the generation batch is fixed when the batch starts (`normalization.micro_batch_of`), so as soon as the
last member of micro-batch b has final tokens (content, not reward: the term is advantage-free), one forward with
`output_router_logits=True` over exactly that micro-batch, in TRL's row order and padding, and one backward of
`coef · aux_b / GA` go straight into the batch direction (no barrier scalar, like TRL's, which adds it after the
loss normalization). Cost: one extra forward + backward of each micro-batch; memory: one parameter-sized buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..errors import BatchIncompleteError
from ..types import Rollout

# (rollouts of one micro-batch in TRL's row order, scale) -> (flat FP32 gradient of scale·aux_b (P,), aux_b)
ChunkBackward = Callable[[Sequence[Rollout], float], tuple[torch.Tensor, float]]


@dataclass(frozen=True)
class RouterAuxResult:
    """The router auxiliary term of one generation batch, for the barrier and the logs."""

    direction: torch.Tensor  # Σ_b ∇(coef · aux_b / GA), FP32 (P,): added to the batch direction as is
    values: tuple[float, ...]  # aux_b per micro-batch b (TRL logs each as `aux_loss`)
    scale: float  # coef / GA (TRL's `router_aux_loss_coef` over `current_gradient_accumulation_steps`)

    @property
    def loss(self) -> float:
        """The term's contribution to the loss TRL reports for the optimizer step: Σ_b coef · aux_b / GA."""
        return sum(self.scale * v for v in self.values)


class RouterAuxLoss:
    """Collects each micro-batch's members as their content becomes final; runs its backward when it is complete."""

    def __init__(self, *, permutation: Sequence[int], micro_batches: int, scale: float, chunk_backward: ChunkBackward,
                 num_params: int, device: torch.device | str = "cpu") -> None:
        if len(permutation) % micro_batches:
            raise ValueError(f"{len(permutation)} rows do not split into {micro_batches} micro-batches")
        size = len(permutation) // micro_batches
        # TRL's shuffle-then-split: micro-batch b holds rows permutation[b·size:(b+1)·size], in that order
        self.members = [list(permutation[b * size:(b + 1) * size]) for b in range(micro_batches)]
        self.micro_batch = {row: b for b, rows in enumerate(self.members) for row in rows}
        self.micro_batches = micro_batches
        self.scale = scale  # coef / GA
        self.chunk_backward = chunk_backward
        self.num_params = num_params
        self.device = torch.device(device)
        self.arrived: dict[int, dict[int, Rollout]] = {b: {} for b in range(micro_batches)}
        self.values: dict[int, float] = {}
        self.direction: torch.Tensor | None = None

    def add(self, rollout: Rollout) -> int | None:
        """Record one trajectory's final tokens (a repeat is ignored). When they complete a micro-batch, run its
        backward and return the micro-batch's context tokens (for the trace); otherwise return None."""
        b = self.micro_batch[rollout.index]
        if b in self.values or rollout.index in self.arrived[b]:
            return None
        self.arrived[b][rollout.index] = rollout
        if len(self.arrived[b]) < len(self.members[b]):
            return None
        rows = [self.arrived[b][row] for row in self.members[b]]
        grad, value = self.chunk_backward(rows, self.scale)
        if self.direction is None:
            self.direction = torch.zeros(self.num_params, dtype=torch.float32, device=self.device)
        self.direction.add_(grad.to(self.direction.device))
        self.values[b] = value
        del self.arrived[b]
        return sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)

    def nbytes(self) -> int:
        return 0 if self.direction is None else self.direction.numel() * 4

    def abort(self) -> None:
        self.arrived.clear()
        self.direction = None

    def finish(self) -> RouterAuxResult:
        missing = [b for b in range(self.micro_batches) if b not in self.values]
        if missing:
            raise BatchIncompleteError(f"the MoE router auxiliary loss of micro-batches {missing} never ran: some of "
                                       "their trajectories never reported final tokens; refusing a partial update")
        direction = self.direction if self.direction is not None else torch.zeros(self.num_params, device=self.device)
        return RouterAuxResult(direction, tuple(self.values[b] for b in range(self.micro_batches)), self.scale)


def padded_micro_batch(rollouts: Sequence[Rollout], pad_token_id: int, attended: Callable[[Rollout], list[int]],
                       pad_to_multiple_of: int | None = None, device: torch.device | str = "cpu"):
    """TRL's tensors of one micro-batch: prompts left-padded, completions right-padded (`trl.trainer.utils.pad`).

    `attended(rollout)` is the completion's attention mask (TRL's `completion_mask`: 1 per token, all 0 for a masked
    truncated completion; tool tokens are attended). Returns (input_ids, attention_mask, logits_to_keep).
    Padding widths are the micro-batch's own (TRL pads to the generation batch's longest row): padded positions are
    masked out of the loss and of attention, and only shift the absolute positions of the real tokens (RoPE: the
    same relative positions), a rounding-level difference.
    """
    def width(n: int) -> int:
        if pad_to_multiple_of:
            n = -(-n // pad_to_multiple_of) * pad_to_multiple_of
        return n

    prompt_width = width(max(len(r.prompt_ids) for r in rollouts))
    completion_width = width(max(len(r.completion_ids) for r in rollouts))
    ids, mask = [], []
    for r in rollouts:
        left = prompt_width - len(r.prompt_ids)
        right = completion_width - len(r.completion_ids)
        completion_mask = list(attended(r))
        ids.append([pad_token_id] * left + list(r.prompt_ids) + list(r.completion_ids) + [pad_token_id] * right)
        mask.append([0] * left + [1] * len(r.prompt_ids) + completion_mask + [0] * right)
    return (torch.tensor(ids, device=device), torch.tensor(mask, device=device), completion_width)
