"""Per-token distillation objectives on one turn's action positions. Pure functions; shapes in the docstrings.

Both objectives are sums over scored tokens; the batch normalization by N_k (paper Eq. 9) happens once, at the
barrier, which is what lets every turn's backward run as soon as its teacher scores arrive.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def action_logprobs(logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """logits (T, V), actions (T,) int64 → log π(a_t | h_t) (T,), FP32, differentiable."""
    return F.log_softmax(logits.float(), dim=-1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)


def opd_loss_sum(student_logits: torch.Tensor, actions: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """Turn-level OPD (paper Eq. 8): −Σ_t ratio_t · A_t with A_t = sg(log π_T − log π_θk) and ratio_t =
    exp(log π_θ − sg(log π_θ)), which is 1 at θ_k but keeps ∇ log π_θ. Inputs: (T, V), (T,), (T,) → scalar."""
    logps = action_logprobs(student_logits, actions)
    advantage = (teacher_logprobs.to(logps) - logps).detach()
    ratio = torch.exp(logps - logps.detach())
    return -(ratio * advantage).sum()


def generalized_jsd_per_token(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float,
                              temperature: float = 1.0) -> torch.Tensor:
    """GKD's generalized Jensen–Shannon divergence per position, summed over the vocabulary: (T, V) × 2 → (T,).

    β = 0: KL(π_T ‖ π_S); β = 1: KL(π_S ‖ π_T); otherwise β·KL(π_T ‖ M) + (1−β)·KL(π_S ‖ M) with the mixture
    M = β·π_T + (1−β)·π_S (the convention of `trl.experimental.gkd.GKDTrainer.generalized_jsd_loss`).
    """
    s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    t = F.log_softmax(teacher_logits.float().to(s.device) / temperature, dim=-1)
    if beta == 0.0:
        return (t.exp() * (t - s)).sum(-1)
    if beta == 1.0:
        return (s.exp() * (s - t)).sum(-1)
    mixture = torch.logsumexp(torch.stack([s + math.log1p(-beta), t + math.log(beta)]), dim=0)
    return beta * (t.exp() * (t - mixture)).sum(-1) + (1.0 - beta) * (s.exp() * (s - mixture)).sum(-1)
