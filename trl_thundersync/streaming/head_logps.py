"""Per-token log-probabilities and entropies from logits rows, in the reduction order of TRL's fused LM head.

TRL 1.16 scores completions with `add_fused_lm_head` (`trl/kernels/chunked_logprob.py`): per vocabulary tile of
`VOCAB_TILE` columns it scales z = logits · (1/T), folds the tile into an online log-sum-exp (running max m, Σ e,
Σ e·z with e = exp(z − m)) and finally returns

    log π(a) = z_a − (m + log Σ e)            H = (m + log Σ e) − Σ e·z / Σ e

A pass that gets logits rows instead of TRL's log-probs (the shared-prefix member's continuation over its prefix's
key/values, `shared_prefix.py`) must use the same arithmetic: `log_softmax(z)[a]` rounds differently (≈ 1 ulp of
|log π| ≈ 5e-7 on a 6-nat token), and cispo's logged policy value Σ_i A_i·c_i·Σ_t log π_it, whose advantages cancel
~100× across the group, turns that into a 2e-5 relative error in the `policy_loss` TRL logs. With the same logits rows
this function gives TRL's torch (non-Triton) log-probs bit for bit; on a Triton device TRL folds the tile in blocks, a
rounding-level difference. The max m is a constant of the math (it cancels), so it carries no gradient: the gradient
with respect to z is onehot(a) − softmax(z), TRL's own backward.
"""

from __future__ import annotations

import torch

VOCAB_TILE = 32768  # TRL's `_CHUNKED_LOGPROB_CHUNK_SIZE`: the online log-sum-exp folds the vocabulary in these tiles


def head_logps(logits: torch.Tensor, actions: torch.Tensor, temperature: float = 1.0,
               entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(actions) (N,) of `logits` rows (N, V) at `temperature`, and the rows' entropies (N,) if `entropy`
    (None otherwise); FP32, differentiable through `logits`."""
    z = logits.float() * (1.0 / temperature)
    rows = z.shape[0]
    running_max = torch.full((rows,), float("-inf"), device=z.device)
    sum_exp = torch.zeros(rows, device=z.device)
    weighted = torch.zeros(rows, device=z.device) if entropy else None
    target = torch.zeros(rows, device=z.device)
    for start in range(0, z.shape[-1], VOCAB_TILE):
        tile = z[:, start : start + VOCAB_TILE]
        new_max = torch.maximum(running_max, tile.detach().amax(-1))
        rescale = torch.exp(running_max - new_max)
        e = torch.exp(tile - new_max.unsqueeze(-1))
        sum_exp = sum_exp * rescale + e.sum(-1)
        if weighted is not None:
            weighted = weighted * rescale + (e * tile).sum(-1)
        running_max = new_max
        local = actions - start
        inside = (local >= 0) & (local < tile.shape[-1])
        picked = tile.gather(-1, local.clamp(0, tile.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
        target = torch.where(inside, picked, target)
    log_z = running_max + torch.log(sum_exp)
    return target - log_z, (log_z - weighted / sum_exp) if weighted is not None else None
