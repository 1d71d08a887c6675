"""Numbers logged for one GRPO batch that are computed from the learner's totals: TRL's reward statistics and the
memory bound of the streamed statistics (the ceiling `thundersync/stats_peak_mb` is checked against)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from trl.trainer.utils import nanstd

from .accumulators import stats_memory_bytes
from .learner_records import BatchTotals


def reward_metrics(rewards_per_func: torch.Tensor, names: Sequence[str], rewards: Sequence[float]) -> dict[str, float]:
    """TRL's `rewards/<name>/mean|std`, `reward` and `reward_std`: nanmean and nanstd over the rows of this process.

    `rewards_per_func` is (B, K) (NaN where a function returned None); `rewards` the weighted sums (NaN: unscorable).
    """
    out = {}
    for i, name in enumerate(names):
        out[f"rewards/{name}/mean"] = torch.nanmean(rewards_per_func[:, i]).item()
        out[f"rewards/{name}/std"] = nanstd(rewards_per_func[:, i]).item()
    weighted = torch.tensor(rewards, dtype=torch.float32)
    out["reward"] = torch.nanmean(weighted).item()
    out["reward_std"] = nanstd(weighted).item()
    return out


def stats_bound_bytes(totals: BatchTotals, *, batch_size: int, num_generations: int, max_open_groups: int | None,
                      release: str, beta: float, max_buffered: int | None, micro_batches: int,
                      num_reward_functions: int, off_policy_mask: bool) -> int:
    """`streamed_state_bytes` for one batch, the optional terms read from the learner's totals."""
    return streamed_state_bytes(
        totals.accumulator.num_params, batch_size=batch_size,
        open_groups=max_open_groups or batch_size // num_generations, release=release, beta=beta,
        max_buffered=max_buffered, micro_batches=micro_batches,
        router=totals.router_aux is not None, entropy=totals.entropy_terms is not None,
        objective_functions=num_reward_functions if totals.objective_rewards is not None else 0,
        off_policy_mask=off_policy_mask, num_generations=num_generations)


def streamed_state_bytes(num_params: int, *, batch_size: int, num_generations: int, open_groups: int, release: str,
                         beta: float, max_buffered: int | None, micro_batches: int, router: bool, entropy: bool,
                         objective_functions: int, off_policy_mask: bool) -> int:
    """Memory bound of the streamed statistics of one process (FP32, P = `num_params` trainable parameters):
    4·(2k+1)·P for k open groups, plus 4·m·P of release buffers (m the buffer cap), plus the buffers of the optional
    terms (router, entropy bonus, normalize_then_sum with K = `objective_functions` > 0, off-policy mask). The run's
    memory plan (`trl_thundersync.memory`) and the logged `thundersync/stats_bound_mb` both come from here."""
    bound = stats_memory_bytes(num_params, open_groups)
    if release != "reward":  # one H_i per buffered trajectory (and K_i / E_i under 'turn': β, coef ≠ 0)
        vectors = 2 if release == "turn" and beta != 0.0 else 1
        if release == "turn" and entropy:
            vectors += 1
        bound += 4 * vectors * num_params * min(max_buffered or batch_size, batch_size)
    if router:  # the MoE router term's batch buffer
        bound += 4 * num_params
    if entropy:  # the entropy bonus: one buffer per TRL micro-batch
        bound += 4 * micro_batches * num_params
    if objective_functions:  # normalize_then_sum: 2K+1 vectors per open group, +Q in the batch
        bound += 4 * num_params * (2 * objective_functions * open_groups + 1)
    if off_policy_mask:  # masked H_i held until the sign of A_i is known
        held = batch_size if objective_functions else open_groups * num_generations
        bound += 4 * num_params * min(held, batch_size)
    return bound
