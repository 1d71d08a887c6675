"""TRL's vLLM importance-sampling correction, per trajectory: a detached weight c_it on the policy term.

With `use_vllm=True` and `vllm_importance_sampling_correction=True` (TRL's default), TRL multiplies the per-token
policy loss (not the KL term) by a ratio between the learner's and the sampler's probabilities of the sampled tokens:

    d_it = (log π_θk(o_it) − log π_sampler(o_it)) · m_it          (NaN → 0: no correction where unknown)
    token_*:    r_it = exp(d_it)                 sequence_*: r_i = exp(Σ_t d_it)      (one value per trajectory)
    *_truncate: c = clamp(r, clip_min, clip_max)  *_mask:    c = r, or 0 where r < clip_min or r > clip_max

Everything it needs — the trajectory's own log-probs at θ_k and the sampler's — is known when the trajectory is
scored, so the weight streams with the trajectory: the policy term of H_i becomes Σ_t c_it m_it u_i ∇ log π(o_it).

`off_policy_kl` is the per-trajectory statistic of TRL's off-policy sequence mask (`off_policy_mask_threshold`), from
the same two log-probs; the learner applies the mask once the sign of the advantage is known (`learner.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import RolloutError

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@dataclass(frozen=True)
class SamplingCorrection:
    """`GRPOConfig.vllm_importance_sampling_mode / _clip_min / _clip_max` (built from a config by
    `trainers/grpo/settings.sampling_correction`)."""

    mode: str  # one of MODES
    clip_min: float | None  # None: no lower bound
    clip_max: float | None  # None: no upper bound

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"vllm_importance_sampling_mode={self.mode!r} is not one of {MODES}")

    def weights(self, logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """c for one trajectory: `logps`, `sampling_logps`, `mask` are [1, T]; returns [1, T] (token modes) or
        [1, 1] (sequence modes), detached."""
        diff = torch.nan_to_num((logps.detach() - sampling_logps) * mask, nan=0.0)
        if self.mode.startswith("sequence"):
            diff = diff.sum(dim=-1, keepdim=True)
        ratio = torch.exp(diff)
        if self.mode.endswith("truncate"):
            return torch.clamp(ratio, min=self.clip_min, max=self.clip_max)
        low = -math.inf if self.clip_min is None else self.clip_min
        high = math.inf if self.clip_max is None else self.clip_max
        return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def sampler_logps(rollout: Any, device: torch.device | str = "cpu") -> torch.Tensor | None:
    """The sampler's per-token log-probs of one rollout as [1, T] (None → NaN, as TRL maps vLLM's missing values);
    None when the rollout carries none."""
    values = rollout.sampling_logprobs
    if values is None:
        return None
    if len(values) != len(rollout.completion_ids):
        raise RolloutError(f"trajectory {rollout.index}: the off-policy mask needs the sampler's log-prob of every "
                           f"completion token, got {len(values)} for {len(rollout.completion_ids)} tokens")
    return torch.tensor([[math.nan if v is None else v for v in values]], dtype=torch.float32, device=device)


def off_policy_kl(logps: torch.Tensor, sampling_logps: torch.Tensor | None, mask: torch.Tensor) -> float:
    """TRL's `get_off_policy_mask` statistic for one trajectory ([1, T] tensors): the masked mean over its tokens of
    log π_sampler − log π_θ (NaN → 0: no evidence). Without sampler log-probs TRL compares the policy with itself: 0.

    TRL drops a sequence's policy term (×0; the KL term, the importance weight and every normalizer unchanged) when
    its advantage is < 0 and this value is > `off_policy_mask_threshold`."""
    if sampling_logps is None:
        return 0.0
    kl = torch.nan_to_num(sampling_logps.to(logps.device) - logps.detach().float(), nan=0.0)
    return float((kl * mask).sum() / mask.sum().clamp(min=1.0))
