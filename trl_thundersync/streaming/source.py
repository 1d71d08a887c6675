"""Backward pass of one GRPO trajectory at the frozen θ_k: H_i and the advantage-free term K_i.

    H_i = ∇ Σ_t m_it · u_i · log π(o_it)                         (gradient, not a loss: the sign lives in A)
    K_i = ∇ Σ_t m_it · u_i · β · KL_it · ratio_it                 (TRL's k3 KL, ratio ≡ 1 with unit slope)

`m_it` is the loss mask (environment tokens and masked truncated completions are 0), `u_i` the loss type's
per-trajectory weight. With TRL's vLLM importance-sampling correction the policy term is weighted by the detached
c_it of `importance.py` (the KL term is not, as in TRL). One forward; two vector-Jacobian products only when β ≠ 0.

With TRL's entropy bonus (`entropy_coef`, `use_adaptive_entropy`) the forward also returns the per-token entropies
H_it of the temperature-scaled logits, and one more vector-Jacobian product gives

    E_i = ∇ Σ_t m_it · (−coef) · H_it                              (advantage-free, like K_i)

which the learner adds into its TRL micro-batch's buffer; the barrier scales each buffer by 1/(max(N_b, 1)·GA)
(`normalization.entropy_scales`). `coef` is the one applied to the whole batch; with coef = 0 (adaptive entropy
gated off) only the entropy value Σ_t m_it H_it is kept, for the controller and the `entropy` metric.

The loss value TRL reports is not the gradient's potential: at ratio 1 TRL's per-token policy loss is −A_i·g·h_it·c_it
with h_it = log π(o_it) for cispo (g = min(1, ε_high)) and vespo (φ = 1), h_it = 1 otherwise (sapo: g = 2/τ_±, by the
sign of A_i, applied at the barrier). Each backward therefore also returns the value coefficient

    V_i = Σ_t m_it · u_i · g · c_it · h_it                          (`policy_value`; sapo's 2/τ_± not included)

so that the barrier's loss is s_b·(free_i − A_i·V_i) per trajectory, as TRL's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..errors import NonFiniteGradientError, RolloutError
from ..types import Rollout, ScoredRollout
from .gradient_sinks import FlatGradient, all_finite
from .head_logps import head_logps
from .importance import SamplingCorrection, off_policy_kl, sampler_logps
from .learner_records import SourceGradients
from .normalization import LossNormalization
from .prefix_groups import PrefixGroups
from .sampling_difference import SamplingStats, row_stats

# (input_ids (1, L), attention_mask (1, L), logits_to_keep) -> per-token log-probs (1, logits_to_keep)
LogProbFn = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
# the same, with the per-token entropies (1, logits_to_keep) of TRL's `compute_entropy=True`
LogProbEntropyFn = Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


def policy_value(normalization: LossNormalization, logps: torch.Tensor, mask: torch.Tensor,
                 weights: torch.Tensor | None = None, sequence_weight: float = 1.0) -> float:
    """V_i = Σ_t m_t · u_i · g · c_t · h_t (module docstring) for one trajectory; `logps`, `mask` are [1, T] (or [T]),
    `weights` the IS weights c ([1, T], [1, 1]; None: 1), `sequence_weight` u_i (the trajectory's token count's)."""
    terms = logps.detach().float() if normalization.kind.log_prob_valued else torch.ones_like(logps).float()
    if weights is not None:
        terms = terms * weights.detach().float()
    terms = torch.where(mask.bool(), terms, torch.zeros_like(terms))
    return float(terms.sum()) * sequence_weight * normalization.policy_coefficient


def flatten_grads(grads: Sequence[torch.Tensor | None], params: Sequence[torch.Tensor]) -> torch.Tensor:
    """Concatenate per-parameter gradients into one FP32 vector (zeros where a parameter got none)."""
    parts = [(g if g is not None else torch.zeros_like(p)).reshape(-1).to(torch.float32)
             for g, p in zip(grads, params, strict=True)]
    return torch.cat(parts)


def write_flat_grads(vector: torch.Tensor, params: Sequence[torch.Tensor], *, add: bool = False) -> None:
    """Write a flat direction into `param.grad` (overwriting, or adding to it with `add`), in each parameter's dtype
    and shape."""
    offset = 0
    for p in params:
        n = p.numel()
        chunk = vector[offset : offset + n].view_as(p).to(p.dtype)
        if p.grad is None:
            p.grad = chunk.clone()
        elif add:
            p.grad.add_(chunk)
        else:
            p.grad.copy_(chunk)
        offset += n


def loss_mask(rollout, eos_and_pad: Sequence[int], mask_truncated: bool) -> torch.Tensor:
    """TRL's per-token loss mask for one trajectory: env_mask × (not truncated, if masking truncations).

    Truncation is the rollout's own flag when it has one (agent loops know why they stopped), otherwise TRL's rule:
    the last token is neither EOS nor pad.
    """
    ids = rollout.completion_ids
    mask = torch.tensor(rollout.env_mask if rollout.env_mask is not None else [1] * len(ids), dtype=torch.float32)
    truncated = rollout.truncated if rollout.truncated is not None else bool(ids) and ids[-1] not in eos_and_pad
    if mask_truncated and truncated:
        mask = torch.zeros_like(mask)
    return mask


class TrajectoryBackward:
    """Callable handed to `GRPOBatchLearner` as its `source_backward`."""

    def __init__(
        self,
        *,
        params: Sequence[torch.Tensor],
        logps_fn: LogProbFn,
        normalization: LossNormalization,
        eos_and_pad: Sequence[int],
        mask_truncated: bool,
        beta: float = 0.0,
        ref_logps_fn: LogProbFn | None = None,
        bias_correction_kl: bool = True,
        device: torch.device | str = "cpu",
        correction: SamplingCorrection | None = None,
        logps_entropy_fn: LogProbEntropyFn | None = None,
        entropy_coef: float | None = None,
        off_policy_sampling: bool = False,
        sequence_level_kl: bool = False,
        prefixes: PrefixGroups | None = None,
        temperature: float = 1.0,
    ) -> None:
        if beta != 0.0 and ref_logps_fn is None:
            raise ValueError("beta != 0 needs reference log-probabilities")
        self.params = list(params)
        self.logps_fn = logps_fn
        self.ref_logps_fn = ref_logps_fn
        self.normalization = normalization
        self.eos_and_pad = tuple(eos_and_pad)
        self.mask_truncated = mask_truncated
        self.beta = beta
        self.bias_correction_kl = bias_correction_kl
        # importance_sampling_level="sequence": the KL's bias-correction ratio is the sequence's (TRL's coef_1, one
        # value per row), whose gradient spreads the row's KL over all its tokens
        self.sequence_level_kl = sequence_level_kl
        self.device = torch.device(device)
        self.correction = correction  # TRL's vLLM importance-sampling weight on the policy term (None: off)
        if entropy_coef is not None and logps_entropy_fn is None:
            raise ValueError("the entropy bonus needs per-token entropies (logps_entropy_fn)")
        self.logps_entropy_fn = logps_entropy_fn
        self.entropy_coef = entropy_coef  # the batch's applied coefficient; None: no entropy bonus
        self.off_policy_sampling = off_policy_sampling  # off-policy mask: use the rollout's sampler log-probs
        self.prefixes = prefixes  # the batch's shared prefixes (None: every pass is a full one)
        self.temperature = temperature  # TRL's sampling temperature, scaling the logits of a prefix path's rows

    def __call__(self, source: ScoredRollout, bucket: int) -> SourceGradients:
        """Reward release: the backward of a scored trajectory (H_i skipped when it is unscorable)."""
        return self.gradients(source.rollout, score=source.scorable)

    def content(self, rollout: Rollout, bucket: int) -> SourceGradients:
        """Content release: the backward of a finished trajectory whose reward is not known yet.

        H_i does not depend on R_i, so it is computed now and bound to the reward later; if the reward then turns
        out unscorable, the learner drops H_i (TRL gives the row A = 0) and keeps K_i and the token count.
        """
        return self.gradients(rollout, score=True)

    def gradients(self, rollout: Rollout, *, score: bool) -> SourceGradients:
        """One forward, then one vector-Jacobian product per needed term: H_i (`score`), K_i (β ≠ 0), E_i (entropy)."""
        ids = torch.tensor([list(rollout.prompt_ids) + list(rollout.completion_ids)], device=self.device)
        attention = torch.ones_like(ids)
        keep = len(rollout.completion_ids)
        mask = loss_mask(rollout, self.eos_and_pad, self.mask_truncated).to(self.device).unsqueeze(0)
        tokens = int(mask.sum().item())
        weight = self.normalization.sequence_weight(tokens)

        need_score = score and tokens > 0
        need_free = self.beta != 0.0 and tokens > 0
        need_entropy = self.entropy_coef is not None and tokens > 0
        if not (need_score or need_free or need_entropy):
            sampling = self._sampling_stats(rollout, ids, attention, keep, mask)
            return SourceGradients(None, None, tokens, sampling=sampling)

        if self.prefixes is not None:
            shared = self._prefix_gradients(rollout, mask, tokens, weight, (need_score, need_free, need_entropy))
            if shared is not None:
                return shared
        logps, entropies = self._forward(rollout, ids, attention, keep, mask, need_entropy)
        outputs: list[tuple[str, torch.Tensor]] = []  # (term kind, scalar to differentiate), in VJP order
        off_policy, value = self._score_term(rollout, logps, mask, weight, outputs) if need_score else (0.0, 0.0)
        free_value, kl_sum = 0.0, 0.0
        if need_free:
            with torch.no_grad():
                ref = self.ref_logps_fn(ids, attention, keep)
            free_value, kl_sum = self._free_term(ref, logps, mask, weight, outputs)
        entropy_sum = self._entropy_term(entropies, mask, outputs) if need_entropy else 0.0

        vectors = self._vectors(outputs)
        score = vectors.get("score")
        if score is not None and not all_finite(score):
            raise NonFiniteGradientError(
                f"trajectory {rollout.index} (group {rollout.group}) produced a non-finite gradient"
            )
        return SourceGradients(score, vectors.get("free"), tokens, free_value, kl_sum,
                               vectors.get("entropy"), entropy_sum, off_policy, value,
                               self._sampling_stats(rollout, ids, attention, keep, mask, logps))

    def _prefix_gradients(self, rollout: Rollout, mask: torch.Tensor, tokens: int, weight: float,
                          needs: tuple[bool, bool, bool]) -> SourceGradients | None:
        """The same terms as the full pass, from the completion's forward over its group's shared prefix
        (`prefix_groups`): parameter gradients here, boundary adjoints in `SourceGradients.prefix`. None: the
        member runs its full pass (no prefix for its group, or a mismatch)."""
        found: dict[str, float | torch.Tensor] = {}
        objective = self._row_objective(rollout, mask, weight, needs, found)
        # a zeroed parameter-sized vector per channel the objective produces, none for the others
        sinks = {c: FlatGradient(self.params, self.device)
                 for c, need in zip(("score", "free", "entropy"), needs, strict=True) if need}
        shared = self.prefixes.member(rollout, objective, sinks)
        if shared is None:
            return None
        result, share = shared
        vectors = {c: sinks[c].vector for c in result.values}
        score = vectors.get("score")
        if score is not None and not all_finite(score):
            raise NonFiniteGradientError(
                f"trajectory {rollout.index} (group {rollout.group}) produced a non-finite gradient")
        ids = torch.tensor([list(rollout.prompt_ids) + list(rollout.completion_ids)], device=self.device)
        sampling = self._sampling_stats(rollout, ids, torch.ones_like(ids), len(rollout.completion_ids), mask,
                                        found["logps"])
        return SourceGradients(score, vectors.get("free"), tokens, found.get("free_value", 0.0),
                               found.get("kl_sum", 0.0), vectors.get("entropy"), found.get("entropy_sum", 0.0),
                               found.get("off_policy", 0.0), found.get("value", 0.0), sampling, prefix=share)

    def _row_objective(self, rollout: Rollout, mask: torch.Tensor, weight: float, needs: tuple[bool, bool, bool],
                       found: dict[str, float | torch.Tensor]) -> Callable[[torch.Tensor, torch.Tensor],
                                                                             dict[str, torch.Tensor]]:
        """A member's objective over its logits rows (a pass over its group's prefix): channel -> potential, as the
        full pass's; the values it logs go into `found`."""

        def objective(logits: torch.Tensor, actions: torch.Tensor) -> dict[str, torch.Tensor]:
            # TRL's fused-head arithmetic, not log_softmax: the logged values must round as the full pass's do
            logps, entropies = head_logps(logits, actions, self.temperature, entropy=needs[2])

            def reference() -> torch.Tensor:
                return head_logps(self.prefixes.reference_logits(rollout), actions, self.temperature)[0][None]

            return self.row_potentials(rollout, logps.unsqueeze(0), entropies.unsqueeze(0) if needs[2] else None,
                                       reference, mask, weight, needs, found)

        return objective

    def row_potentials(self, rollout: Rollout, logps: torch.Tensor, entropies: torch.Tensor | None,
                       reference: Callable[[], torch.Tensor], mask: torch.Tensor, weight: float,
                       needs: tuple[bool, bool, bool],
                       found: dict[str, float | torch.Tensor]) -> dict[str, torch.Tensor]:
        """One trajectory's potentials from its per-token log-probs `logps` [1, T] (entropies [1, T]; `reference()`
        the KL reference's [1, T], called only with β ≠ 0): channel ("score", "free", "entropy") -> the scalar whose
        gradient is H_i, K_i, E_i; the values it logs go into `found`. Loud on a non-finite log-prob."""
        need_score, need_free, need_entropy = needs
        if not torch.isfinite(logps[mask.bool()]).all():
            raise NonFiniteGradientError(
                f"trajectory {rollout.index} (group {rollout.group}) has non-finite log-probabilities at policy "
                f"version {rollout.policy_version}; refusing to accumulate it")
        found["logps"] = logps.detach()
        outputs: list[tuple[str, torch.Tensor]] = []
        if need_score:
            found["off_policy"], found["value"] = self._score_term(rollout, logps, mask, weight, outputs)
        if need_free:
            with torch.no_grad():
                ref = reference()
            found["free_value"], found["kl_sum"] = self._free_term(ref, logps, mask, weight, outputs)
        if need_entropy:
            found["entropy_sum"] = self._entropy_term(entropies, mask, outputs)
        return dict(outputs)

    def _sampling_stats(self, rollout: Rollout, ids: torch.Tensor, attention: torch.Tensor, keep: int,
                        mask: torch.Tensor, logps: torch.Tensor | None = None) -> SamplingStats | None:
        """The sampler-vs-learner statistics of this trajectory (`sampling_difference`); None when it carries no
        sampler log-prob per completion token. TRL's statistics count every row, so a row whose backward needs no
        forward (unscorable, nothing else to learn) gets one here, without gradients."""
        sampled = rollout.sampling_logprobs
        if sampled is None or len(sampled) != len(rollout.completion_ids):
            return None
        if logps is None:
            if mask.any():
                with torch.no_grad():
                    logps = self.logps_fn(ids, attention, keep)
            else:  # no loss token: only the weight of a sequence mode, from an all-zero difference, counts
                logps = torch.zeros_like(mask)
        return row_stats(logps, sampler_logps(rollout, self.device), mask, self.correction)

    def _forward(self, rollout: Rollout, ids: torch.Tensor, attention: torch.Tensor, keep: int, mask: torch.Tensor,
                 need_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log π(o_it) [1, T] (and entropies H_it [1, T] with the entropy bonus); loud on non-finite ones."""
        if need_entropy:
            logps, entropies = self.logps_entropy_fn(ids, attention, keep)
        else:
            logps, entropies = self.logps_fn(ids, attention, keep), None
        if not torch.isfinite(logps[mask.bool()]).all():
            raise NonFiniteGradientError(
                f"trajectory {rollout.index} (group {rollout.group}) has non-finite log-probabilities at policy "
                f"version {rollout.policy_version}; refusing to accumulate it"
            )
        return logps, entropies

    def _score_term(self, rollout: Rollout, logps: torch.Tensor, mask: torch.Tensor, weight: float,
                    outputs: list[tuple[str, torch.Tensor]]) -> tuple[float, float]:
        """Appends Σ_t m_it · u_i · c_it · log π(o_it) (H_i's potential); returns (off-policy KL, V_i)."""
        off_policy = 0.0
        if self.off_policy_sampling:
            off_policy = off_policy_kl(logps, sampler_logps(rollout, self.device), mask)
        policy = logps * mask
        weights = None
        if self.correction is not None:
            weights = self.correction.weights(logps, self._sampling_logps(rollout), mask)
            policy = policy * weights
        outputs.append(("score", policy.sum() * weight * self.normalization.policy_coefficient))
        return off_policy, policy_value(self.normalization, logps, mask, weights, weight)

    def _free_term(self, ref: torch.Tensor, logps: torch.Tensor, mask: torch.Tensor, weight: float,
                   outputs: list[tuple[str, torch.Tensor]]) -> tuple[float, float]:
        """Appends β · Σ_t m_it · u_i · KL_it · ratio_it (K_i's potential, `ref` the reference's log-probs [1, T]);
        returns (its value, Σ_t m_it KL_it)."""
        kl = torch.exp(ref - logps) - (ref - logps) - 1
        kl_sum = float((kl.detach() * mask).sum())
        if self.bias_correction_kl:  # TRL's coef_1: exactly 1 at θ_k, its gradient is what counts
            log_ratio = logps - logps.detach()
            if self.sequence_level_kl:
                log_ratio = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
            kl = kl * torch.exp(log_ratio)
        outputs.append(("free", (kl * mask).sum() * weight * self.beta))
        return float(outputs[-1][1].detach()), kl_sum

    def _entropy_term(self, entropies: torch.Tensor, mask: torch.Tensor,
                      outputs: list[tuple[str, torch.Tensor]]) -> float:
        """Appends −coef · Σ_t m_it H_it (E_i's potential) unless coef = 0; returns Σ_t m_it H_it."""
        bonus = (entropies * mask).sum()
        if self.entropy_coef != 0.0 and bonus.requires_grad:
            outputs.append(("entropy", bonus * -self.entropy_coef))
        return float(bonus.detach())

    def _vectors(self, outputs: list[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """One flat FP32 gradient per term, sharing the forward graph until the last product."""
        vectors: dict[str, torch.Tensor] = {}
        for n, (kind, out) in enumerate(outputs):
            grads = torch.autograd.grad(out, self.params, retain_graph=n + 1 < len(outputs), allow_unused=True)
            vectors[kind] = flatten_grads(grads, self.params)
        return vectors

    def _sampling_logps(self, rollout) -> torch.Tensor:
        values = rollout.sampling_logprobs
        if values is None or len(values) != len(rollout.completion_ids):
            raise RolloutError(
                f"trajectory {rollout.index}: the vLLM importance-sampling correction needs the sampler's log-prob of "
                f"every completion token, got {None if values is None else len(values)} for "
                f"{len(rollout.completion_ids)} tokens"
            )
        return torch.tensor([values], dtype=torch.float32, device=self.device)
