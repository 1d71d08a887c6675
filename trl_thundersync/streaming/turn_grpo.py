"""GRPO learner work per agentic turn (content-ready release): each turn's backward while that turn's tool runs.

For trajectory i, turn j appends tokens whose last |a_j| are the action a_j. Through the boundary-cut core
(`segment_backward.BoundaryCut`, linear cost in the number of turns) up to three channels accumulate, each into its own
per-trajectory FP32 P-vector (`source.flatten_grads` order):

    score:  s_i = ∇ Σ_j Σ_{t∈a_j} c_t · log π(a_t)        c_t: TRL's token-mode vLLM importance weight, else 1
    free:   k_i = ∇ Σ_j Σ_{t∈a_j} β · KL_t · ratio_t       k3 KL to the reference; ratio ≡ 1 with unit slope (β ≠ 0)
    entropy: e_i = ∇ Σ_j Σ_{t∈a_j} (−coef) · H_t           TRL's entropy bonus (coef ≠ 0 this batch)

(H_t the full-vocabulary entropy of softmax(logits / temperature); with coef = 0 only its value is kept.)

with log π = log_softmax(logits / temperature), as TRL's `_get_per_token_logps_and_entropies` computes it. `finish`
then applies what is known only when the trajectory's content is complete (`source.TrajectoryBackward`'s math):

    mask_truncated ∧ truncated (source.loss_mask) → SourceGradients(None, None, 0)
    H_i = s_i · u_i · policy_coefficient · c_i      u_i = normalization.sequence_weight(|m_i|) (grpo: 1/|o_i|)
    K_i = k_i · u_i                                  c_i: TRL's sequence-mode weight from the recorded log-probs
    E_i = e_i                                        (normalized per TRL micro-batch at the barrier)
    V_i = Σ_j Σ_{t∈a_j} c_t · h_t · u_i · policy_coefficient · c_i
                                                     the loss value's coefficient (`source.policy_value`;
                                                     h_t = log π(a_t) for cispo / vespo, else 1),
                                                     from the turns' records

Exact only when the turns are the rollout's token history: the turns' context + action tokens are a prefix of
prompt + completion, and the action positions are exactly the env_mask-1 positions (token modes: with the sampler
log-probs the turns used). Otherwise `finish` returns None (reason in `fallbacks`) and the caller runs the
whole-trajectory `TrajectoryBackward`. One instance per logical batch; `turn` and `finish` from one thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, get_args

import torch

from ..errors import ConfigurationError, NonFiniteGradientError, StalePolicyError
from ..types import Rollout, TurnBackward, TurnEvent
from .gradient_sinks import FlatGradient, all_finite
from .importance import SamplingCorrection, off_policy_kl, sampler_logps
from .learner import SourceGradients
from .normalization import LossNormalization
from .prefix_groups import PrefixGroups
from .sampling_difference import SamplingStats, row_stats
from .segment_backward import BoundaryCut, FullContext
from .shared_prefix import PassWork
from .source import loss_mask, policy_value
from .turn_reference import TurnReference

ContextFactory = Callable[[], contextlib.AbstractContextManager]
TURN_BACKWARDS: tuple[TurnBackward, ...] = get_args(TurnBackward)


@dataclass
class _Open:
    """Per-trajectory state between its first turn and `finish`."""

    version: int  # policy version of its first turn
    score: FlatGradient  # s_i
    free: FlatGradient | None  # k_i (β ≠ 0)
    ids: list[int] = field(default_factory=list)  # the token history its turns covered
    spans: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each action in `ids`
    logps: list[torch.Tensor] = field(default_factory=list)  # detached learner log-probs per action (|a_j|,)
    sampled: list[tuple[float, ...] | None] = field(default_factory=list)  # event.action_logprobs per action
    kl: list[torch.Tensor] = field(default_factory=list)  # detached KL_t per action (β ≠ 0)
    entropy: FlatGradient | None = None  # e_i (entropy_coef ≠ 0)
    entropies: list[torch.Tensor] = field(default_factory=list)  # detached Σ_t H_t per action (entropy bonus on)
    weights: list[torch.Tensor] = field(default_factory=list)  # detached token-mode IS weights c_t per action
    seeded: bool = False  # its history starts from its group's shared prefix (`prefix_groups.turn_seed`)


class TurnScoreBackward:
    """`turn(event)` per turn in order, `finish(rollout, bucket)` once its content is complete; see module docstring."""

    def __init__(self, *, model: Any, params: Sequence[torch.Tensor], normalization: LossNormalization,
                 eos_and_pad: Sequence[int], mask_truncated: bool, temperature: float = 1.0, beta: float = 0.0,
                 ref_model: Any = None, ref_context: ContextFactory | None = None, bias_correction_kl: bool = True,
                 correction: SamplingCorrection | None = None, device: torch.device | str = "cpu",
                 policy_version: int | None = None, autocast: ContextFactory | None = None,
                 turn_backward: TurnBackward = "boundary_cut", entropy_coef: float | None = None,
                 off_policy_sampling: bool = False, prefixes: PrefixGroups | None = None,
                 flops: Callable[[PassWork], float] | None = None) -> None:
        if beta != 0.0 and ref_model is None:
            raise ValueError("beta != 0 needs a reference model (ref_model; with PEFT the policy and ref_context)")
        if turn_backward not in TURN_BACKWARDS:
            raise ConfigurationError(f"turn_backward={turn_backward!r} is not one of {TURN_BACKWARDS}")
        checkpointing = getattr(model, "is_activation_checkpointing", None)  # transformers ≥ 5.2x; older name below
        if checkpointing is None:
            checkpointing = getattr(model, "is_gradient_checkpointing", False)
        if turn_backward == "boundary_cut" and checkpointing:
            raise ConfigurationError("gradient_checkpointing=True: the boundary-cut backward keeps each turn's "
                                     "key/value graph, which activation checkpointing drops; set "
                                     "gradient_checkpointing=False, use turn_backward='naive', or release per "
                                     "trajectory")
        self.params, self.device = list(params), torch.device(device)
        self.normalization, self.eos_and_pad, self.mask_truncated = normalization, tuple(eos_and_pad), mask_truncated
        self.temperature, self.beta, self.bias_correction_kl = temperature, beta, bias_correction_kl
        self.correction, self.policy_version = correction, policy_version
        self.entropy_coef = entropy_coef  # the batch's applied entropy-bonus coefficient; None: no bonus
        self.off_policy_sampling = off_policy_sampling  # off-policy mask statistic from the sampler log-probs
        self.autocast = autocast if autocast is not None else contextlib.nullcontext
        self.core = (BoundaryCut if turn_backward == "boundary_cut" else FullContext)(model, self.params, self.device)
        self.reference = TurnReference(ref_model, temperature=temperature, device=self.device,
                                       context=ref_context) if beta != 0.0 else None
        self.open: dict[int, _Open] = {}
        self.fallbacks: dict[int, str] = {}  # trajectory index -> why `finish` returned None (or will)
        # the batch's shared prefixes: a member's first turn starts from its group's (boundary cut only)
        self.prefixes = prefixes if turn_backward == "boundary_cut" else None
        self.flops = flops  # prices a pass (`shared_prefix.pass_flops`); None: the trace prices items by tokens
        self.last_flops: float | None = None  # learner FLOPs of the last `turns` or `finish` call (None: unpriced)

    @property
    def token_mode(self) -> bool:
        return self.correction is not None and self.correction.mode.startswith("token")

    @property
    def buffer_bytes(self) -> int:
        """FP32 P-vectors one open trajectory holds: 4·P (score), plus 4·P (free) when β ≠ 0, plus 4·P (entropy)
        when the entropy bonus has a non-zero coefficient."""
        return 4 * sum(p.numel() for p in self.params) * (1 + (self.beta != 0.0) + bool(self.entropy_coef))

    # -- per turn ---------------------------------------------------------------------------------------------------
    def turn(self, event: TurnEvent) -> int:
        """Forward + backward of the tokens this turn appended; returns the tokens forwarded (0 when skipped)."""
        return self.turns([event])

    def turns(self, events: Sequence[TurnEvent]) -> int:
        """Consecutive turns of one trajectory, ready together, learned as one segment (`BoundaryCut.turns`: one
        forward and one backward per channel instead of one per turn; the naive backend runs them one by one)."""
        if len(events) > 1 and not isinstance(self.core, BoundaryCut):
            return sum(self.turns([event]) for event in events)
        first, last = events[0], events[-1]
        for event in events:
            if self.policy_version is not None and event.policy_version != self.policy_version:
                raise StalePolicyError(f"trajectory {event.index} turn {event.turn} was sampled at policy version "
                                       f"{event.policy_version}; this batch learns at version {self.policy_version}")
        self.last_flops = 0.0 if self.flops is not None else None
        if first.index in self.fallbacks:
            return 0
        state = self.open.get(first.index)
        if state is None:
            free = FlatGradient(self.params, self.device) if self.beta != 0.0 else None
            state = self.open[first.index] = _Open(first.policy_version, FlatGradient(self.params, self.device), free)
            if self.entropy_coef:
                state.entropy = FlatGradient(self.params, self.device)
            self._seed(state, first)
        reason = next((r for r in (self._refuse(state, e, events) for e in events) if r is not None), None)
        if reason is not None:
            self._fall_back(first.index, f"turn {first.turn}: {reason}")
            return 0
        new = list(last.context_ids[len(state.ids) :]) + list(last.action_ids)
        if not new:
            return 0
        spans = [(len(e.context_ids) - len(state.ids), len(e.context_ids) - len(state.ids) + len(e.action_ids))
                 for e in events if e.action_ids]
        where = f"trajectory {first.index} turn {first.turn}" + (f"..{last.turn}" if len(events) > 1 else "")
        try:
            with self.autocast():
                ref = self.reference.span_logps(first.index, new, spans) if self.reference else None
                sinks = {"score": state.score, "free": state.free, "entropy": state.entropy}
                objective = self._objective(state, events, ref, where)
                outcome = (self.core.turns(events, objective, sinks, where) if len(events) > 1
                           else self.core.turn(first, objective, sinks, where))
        except Exception:
            self.discard(first.index)
            raise
        for event in events:
            if event.action_ids:
                state.spans.append((len(event.context_ids), len(event.context_ids) + len(event.action_ids)))
                state.sampled.append(event.action_logprobs)
        if self.flops is not None and outcome.forwarded_tokens:  # (the naive backend re-runs its whole context)
            cached = len(state.ids) if isinstance(self.core, BoundaryCut) else 0
            self.last_flops = self.flops(PassWork(outcome.forwarded_tokens, cached, len(outcome.values)))
        state.ids += new
        return outcome.forwarded_tokens

    def _seed(self, state: _Open, event: TurnEvent) -> None:
        """A member's first turn: start its history (policy and reference) from its group's shared prefix, if any."""
        seed = self.prefixes.turn_seed(event.index, event.context_ids) if self.prefixes is not None else None
        if seed is None:
            return
        self.core.seed(event.index, seed.ids, seed.keys, seed.values, seed.last_logits)
        if self.reference is not None:
            self.reference.seed(event.index, seed.reference_keys, seed.reference_values, seed.reference_last)
        state.ids, state.seeded = list(seed.ids), True

    def _refuse(self, state: _Open, event: TurnEvent, events: Sequence[TurnEvent] = ()) -> str | None:
        """Why this turn (one of `events`, learned together) cannot be learned per turn exactly (None: it can)."""
        if event.policy_version != state.version:
            return f"sampled at version {event.policy_version}, earlier turns at {state.version}"
        if list(event.context_ids[: len(state.ids)]) != state.ids:
            return "its context does not extend the earlier turns' tokens (rewritten or re-tokenized history)"
        last = events[-1] if events else event
        if last is not event and list(last.context_ids[: len(event.context_ids) + len(event.action_ids)]) != [
                *event.context_ids, *event.action_ids]:  # (a coalesced run: the last turn's context holds this one)
            return "a later turn's context does not extend this turn's tokens (rewritten or re-tokenized history)"
        if self.token_mode and event.action_ids and (
                event.action_logprobs is None or len(event.action_logprobs) != len(event.action_ids)):
            return "token-mode importance sampling needs the sampler's log-prob of every action token at turn time"
        return None

    def _objective(self, state: _Open, events: Sequence[TurnEvent], ref: torch.Tensor | None, where: str):
        lengths = [len(e.action_ids) for e in events if e.action_ids]  # the rows per action, in order

        def objective(logits: torch.Tensor, actions: torch.Tensor) -> dict[str, torch.Tensor]:
            logps = torch.log_softmax(logits.float() / self.temperature, dim=-1)
            logps = logps.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
            if not bool(torch.isfinite(logps.detach()).all()):
                raise NonFiniteGradientError(f"{where} has non-finite log-probabilities at policy version "
                                             f"{events[0].policy_version}")
            state.logps.extend(logps.detach().split(lengths))
            policy = logps
            if self.token_mode:
                sampled = torch.tensor([[v for e in events for v in e.action_logprobs or ()]], dtype=torch.float32,
                                       device=logps.device)
                weights = self.correction.weights(logps[None], sampled, torch.ones_like(sampled))[0]
                state.weights.append(weights.detach())
                policy = logps * weights
            channels = {"score": policy.sum()}
            if self.beta != 0.0:
                ref_ = ref.to(logps.device)
                kl = torch.exp(ref_ - logps) - (ref_ - logps) - 1
                state.kl.append(kl.detach())
                if self.bias_correction_kl:
                    kl = kl * torch.exp(logps - logps.detach())
                channels["free"] = kl.sum() * self.beta
            if self.entropy_coef is not None:
                scaled = torch.log_softmax(logits.float() / self.temperature, dim=-1)
                entropy = -(scaled.exp() * scaled).sum(-1)
                state.entropies.append(entropy.detach().sum())
                if self.entropy_coef != 0.0:
                    channels["entropy"] = entropy.sum() * -self.entropy_coef
            return channels

        return objective

    # -- at the end of the trajectory's content ---------------------------------------------------------------------
    def finish(self, rollout: Rollout, bucket: int = 0) -> SourceGradients | None:
        """`TrajectoryBackward(ScoredRollout(rollout, …), bucket)` of a scorable rollout, from the turns' work; None
        when the turns do not reproduce the rollout (the caller then runs TrajectoryBackward). Frees the state."""
        index = rollout.index
        self.last_flops = None
        mask = loss_mask(rollout, self.eos_and_pad, self.mask_truncated)
        tokens = int(mask.sum().item())
        if tokens == 0:  # nothing scored (e.g. a masked truncation): the turns' work is not needed
            self.discard(index)
            return SourceGradients(None, None, 0, sampling=self._sampling_stats(None, rollout, mask))
        state = self.open.get(index)
        reason = self.fallbacks.get(index) or self._mismatch(state, rollout)
        if reason is None and self.correction is not None and not self.token_mode and (
                rollout.sampling_logprobs is None or len(rollout.sampling_logprobs) != len(rollout.completion_ids)):
            reason = "sequence-mode importance sampling needs the sampler's log-prob of every completion token"
        if reason is not None:  # (TrajectoryBackward raises the typed error where one is due)
            self._fall_back(index, reason)
            return None
        sequence_weight = 1.0
        if self.correction is not None and not self.token_mode:
            sequence_weight = float(self._sequence_weight(state, rollout, mask))
        kl = off_policy_kl(self._laid_out(state, rollout), sampler_logps(rollout),
                           mask.unsqueeze(0)) if self.off_policy_sampling else 0.0
        boundary: dict[str, list] | None = {} if state is not None and state.seeded else None
        self.core.close(index, {"score": state.score, "free": state.free, "entropy": state.entropy}, boundary)
        self.last_flops = self._replay_flops()
        self.discard(index)
        share = None
        if boundary is not None:  # the prefix's adjoints, with the coefficients `_bind` gives each channel
            weight = self.normalization.sequence_weight(tokens)
            scales = {"score": weight * self.normalization.policy_coefficient * sequence_weight, "free": weight,
                      "entropy": 1.0}
            share = self.prefixes.turn_share(index, boundary, scales)
        return replace(self._bind(state, rollout, tokens, sequence_weight), off_policy_kl=kl,
                       sampling=self._sampling_stats(state, rollout, mask), prefix=share)

    def _replay_flops(self) -> float | None:
        """The close's backward products (forward-free: the segments' graphs were kept), priced like `pass_flops`."""
        if self.flops is None or not isinstance(self.core, BoundaryCut):
            return None
        return sum(self.flops(PassWork(tokens, cached, n)) - self.flops(PassWork(tokens, cached, 0))
                   for tokens, cached, n in self.core.replay_work)

    def _sampling_stats(self, state: _Open | None, rollout: Rollout, mask: torch.Tensor) -> SamplingStats | None:
        """`source.TrajectoryBackward`'s sampler-vs-learner statistics, from the turns' recorded log-probs."""
        sampled = rollout.sampling_logprobs
        if sampled is None or len(sampled) != len(rollout.completion_ids):
            return None
        return row_stats(self._laid_out(state, rollout), sampler_logps(rollout), mask.unsqueeze(0), self.correction)

    def _bind(self, state: _Open, rollout: Rollout, tokens: int, sequence_weight: float) -> SourceGradients:
        weight = self.normalization.sequence_weight(tokens)
        score = state.score.vector * (weight * self.normalization.policy_coefficient * sequence_weight)
        if not all_finite(score):
            raise NonFiniteGradientError(f"trajectory {rollout.index} (group {rollout.group}) produced a non-finite "
                                         "gradient")
        entropy_grad = state.entropy.vector if state.entropy is not None else None
        entropy_sum = float(sum(float(v) for v in state.entropies))
        logps = torch.cat([v.float().cpu() for v in state.logps]) if state.logps else torch.zeros(0)
        weights = torch.cat([v.float().cpu() for v in state.weights]) if self.token_mode and state.weights else None
        value = policy_value(self.normalization, logps, torch.ones_like(logps), weights, weight) * sequence_weight
        if state.free is None:
            return SourceGradients(score, None, tokens, entropy_grad=entropy_grad, entropy_sum=entropy_sum,
                                   policy_value=value)
        kl_total = torch.cat(state.kl).sum() if state.kl else torch.zeros(())
        free_value = float(kl_total * weight * self.beta)
        return SourceGradients(score, state.free.vector * weight, tokens, free_value, float(kl_total), entropy_grad,
                               entropy_sum, policy_value=value)

    @staticmethod
    def _laid_out(state: _Open | None, rollout: Rollout) -> torch.Tensor:
        """The turns' recorded learner log-probs laid out over the completion, [1, T] (0 off the actions)."""
        logps = torch.zeros(1, len(rollout.completion_ids), dtype=torch.float32)
        offset = len(rollout.prompt_ids)
        for (start, end), values in zip(state.spans if state else [], state.logps if state else [], strict=True):
            logps[0, start - offset : end - offset] = values.float().cpu()
        return logps

    def _sequence_weight(self, state: _Open | None, rollout: Rollout, mask: torch.Tensor) -> torch.Tensor:
        """TRL's sequence-mode weight c_i from the turns' recorded log-probs, laid out over the completion."""
        logps = self._laid_out(state, rollout)
        sampled = torch.tensor([rollout.sampling_logprobs], dtype=torch.float32)
        return self.correction.weights(logps, sampled, mask.unsqueeze(0))

    def _mismatch(self, state: _Open | None, rollout: Rollout) -> str | None:
        """Why the turns are not exactly the rollout's scored token history (None: they are)."""
        ids = state.ids if state else []
        full = list(rollout.prompt_ids) + list(rollout.completion_ids)
        if full[: len(ids)] != ids:
            return "the turns' tokens are not a prefix of prompt + completion"
        if state is not None and state.version != rollout.policy_version:
            return f"turns sampled at version {state.version}, the rollout says {rollout.policy_version}"
        offset = len(rollout.prompt_ids)
        env = list(rollout.env_mask) if rollout.env_mask is not None else [1] * len(rollout.completion_ids)
        covered = [0] * len(env)
        for start, end in state.spans if state else []:
            if start < offset:
                return "an action lies inside the rollout's prompt"
            covered[start - offset : end - offset] = [1] * (end - start)
        if covered != env:
            if state is None:
                return "no turn of this trajectory was learned (no TurnEvents, e.g. a single-turn engine)"
            return "the action tokens are not exactly the env_mask-1 tokens of the completion"
        if self.token_mode and state is not None:
            sampled = rollout.sampling_logprobs or ()
            for (start, end), values in zip(state.spans, state.sampled, strict=True):
                if tuple(sampled[start - offset : end - offset]) != tuple(values or ()):
                    return "the turns' sampler log-probs differ from the rollout's"
        return None

    # -- state ------------------------------------------------------------------------------------------------------
    def _fall_back(self, index: int, reason: str) -> None:
        self.fallbacks[index] = reason
        self.discard(index)

    def discard(self, index: int) -> None:
        """Free a trajectory's state (buffers, retained graphs, reference cache) without using it."""
        self.open.pop(index, None)
        self.core.discard(index)
        if self.reference is not None:
            self.reference.discard(index)

    def held_bytes(self, index: int | None = None) -> int:
        """Bytes held now for open trajectories (one, or all): P-vector buffers, retained graphs and deferred
        adjoints of the boundary-cut core, reference key/value caches."""
        states = list(self.open.values()) if index is None else [self.open[index]] if index in self.open else []
        buffers = sum(s.score.nbytes + (s.free.nbytes if s.free is not None else 0)
                      + (s.entropy.nbytes if s.entropy is not None else 0) for s in states)
        ref = self.reference.held_bytes(index) if self.reference is not None else 0
        return buffers + self.core.held_bytes(index) + ref
