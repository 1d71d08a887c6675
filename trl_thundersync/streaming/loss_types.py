"""TRL 1.16's GRPO `loss_type`s, one `LossType` entry each: everything the streaming core and the GRPO trainer
need to know about a loss type is read from this table (`loss_type(name)`), never from a list of names.

Adding a TRL loss type is one entry here (and its parity case in `benchmarks/parity.py`); a name with no entry
is refused with `UnknownLossTypeError` wherever it is looked up. What each field means, in the notation of
`streaming/normalization.py` (per-token gradient `ν_it · (−c·A_i ∇log π(o_it) + β ∇[KL_it · ratio_it])`,
`ν_it = u_i · s_b`):

| loss_type | u_i          | s_b                       | value h_t  | gate   | c                 | clip metrics     |
|-----------|--------------|---------------------------|------------|--------|-------------------|------------------|
| grpo      | 1/max(|m|,1) | 1/B                       | 1          | —      | 1                 | clip_ratio/*     |
| sapo      | 1/max(|m|,1) | 1/B                       | 1          | 2/τ_±  | 1                 | —                |
| luspo     | 1            | 1/B                       | 1          | —      | 1                 | clip_ratio/*     |
| dr_grpo   | 1            | 1/(B·max_completion_len)  | 1          | —      | 1                 | clip_ratio/*     |
| bnpo      | 1            | 1/(max(N_b,1)·GA)         | 1          | —      | 1                 | clip_ratio/*     |
| dapo      | 1            | W/max(N,1)                | 1          | —      | 1                 | clip_ratio/*     |
| cispo     | 1            | W/max(N,1)                | log π(o_t) | —      | min(1, ε_high)    | cispo_clip_ratio |
| vespo     | 1            | W/max(N,1)                | log π(o_t) | —      | 1                 | —                |

Two more facts of TRL's `_compute_loss` the table records: `policy_loss` is logged before TRL's division by GA for
the global-token losses (dapo, cispo, vespo) and after it for the others (`trainers/grpo/entropy.py`); vespo folds
vLLM's importance-sampling ratio into its gamma weights, which is not streamed (`trainers/grpo/config.py` and
`checks.py` refuse the correction with it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..errors import UnknownLossTypeError

# s_b, the barrier scalar of bucket b (`LossNormalization.bucket_scales`):
#   "sequences": 1/B; "completion_budget": 1/(B·max_completion_length);
#   "micro_batch_tokens": 1/(max(N_b, 1)·GA) per TRL micro-batch; "global_tokens": W/max(N, 1) over all processes
BucketScale = Literal["sequences", "completion_budget", "micro_batch_tokens", "global_tokens"]
# g(A_i), the factor of the policy value at ratio 1 (`barrier.policy_loss_terms`): "none" 1; "sapo" 2/τ_± by sign A_i
ValueGate = Literal["none", "sapo"]
# c, the detached policy coefficient (`trainers/grpo/settings.py`): "one" 1; "epsilon_high_clamp" min(1, ε_high)
PolicyCoefficient = Literal["one", "epsilon_high_clamp"]
# which clip-ratio metrics TRL's `_compute_loss` logs: "clip_ratio" clip_ratio/*, "cispo" cispo_clip_ratio, "none"
ClipMetrics = Literal["clip_ratio", "cispo", "none"]


@dataclass(frozen=True)
class LossType:
    """One TRL `loss_type` as the streaming core applies it."""

    name: str  # TRL's `GRPOConfig.loss_type` value
    sequence_mean: bool  # u_i = 1/max(|m_i|, 1) (a per-sequence token mean); False: u_i = 1
    bucket_scale: BucketScale  # s_b, fixed at the barrier
    log_prob_valued: bool  # the per-token policy loss at ratio 1 is −g·A·log π(o_t) (True) or −g·A (False)
    value_gate: ValueGate  # g(A_i) in the loss value
    policy_coefficient: PolicyCoefficient  # c in the gradient and the loss value
    clip_metrics: ClipMetrics  # the clip-ratio metrics TRL logs for it
    policy_metric_per_micro_batch: bool  # TRL logs `policy_loss` before its /GA (global-token losses)
    streams_vllm_correction: bool = True  # False: TRL folds vLLM's importance ratio into the loss's own weights
    #   (vespo's gamma weights), which is not streamed, so the correction is refused with it


LOSS_TYPES: dict[str, LossType] = {entry.name: entry for entry in (
    LossType("grpo", True, "sequences", False, "none", "one", "clip_ratio", False),
    LossType("dapo", False, "global_tokens", False, "none", "one", "clip_ratio", True),
    LossType("dr_grpo", False, "completion_budget", False, "none", "one", "clip_ratio", False),
    LossType("bnpo", False, "micro_batch_tokens", False, "none", "one", "clip_ratio", False),
    LossType("cispo", False, "global_tokens", True, "none", "epsilon_high_clamp", "cispo", True),
    LossType("sapo", True, "sequences", False, "sapo", "one", "none", False),
    LossType("vespo", False, "global_tokens", True, "none", "one", "none", True, streams_vllm_correction=False),
    LossType("luspo", False, "sequences", False, "none", "one", "clip_ratio", False),
)}

SUPPORTED_LOSS_TYPES = tuple(LOSS_TYPES)


def loss_type(name: str) -> LossType:
    """The table's entry of `name`; `UnknownLossTypeError` (naming the field `loss_type`) when it has none."""
    try:
        return LOSS_TYPES[name]
    except (KeyError, TypeError):
        raise UnknownLossTypeError(
            f"loss_type={name!r}: no entry in trl_thundersync.streaming.loss_types; supported loss types are "
            f"{SUPPORTED_LOSS_TYPES}") from None
