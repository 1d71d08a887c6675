"""What an on-policy distillation step divides Σ_j g_j by: stock `GKDTrainer`'s count or the scored tokens.

Two conventions exist in TRL 1.16, and `ThunderSyncGKDConfig.on_policy_normalizer` picks one:

- `"num_items_in_batch"` (stock `trl.experimental.gkd.GKDTrainer`, the default for `objective="gjsd"`):
  `transformers.Trainer` counts the label tokens of the *dataset* rows of the accumulation window
  (`labels[..., 1:] != -100`, summed over the window's micro-batches, and over processes when
  `average_tokens_across_devices`) before `training_step` runs; `GKDTrainer.training_step` then replaces the labels
  with generated completions, and `generalized_jsd_loss(..., num_items_in_batch)` divides the completions' JSD sum by
  that count. TRL calls this a bug (huggingface/trl #6452, #6478); a drop-in reproduces it so a swapped script trains
  as before. It costs the stream nothing: the count is known before the batch starts.
- `"scored_tokens"` (TRL's `DistillationTrainer`, and the paper's Eq. 9 for `objective="opd"`, its default): the
  number of completion tokens actually scored, N_k, known only at the barrier.

Per process r the placement receives `factor · Σ_{j ∈ r} g_j / tokens_r` and averages over processes (DDP's
convention). Under `"scored_tokens"` the count is global and `factor = world`: the mean is Σ_j g_j / N, the
one-process step on the same global batch, for any number of processes (TRL's `DistillationTrainer` divides its
gathered count by `num_processes` for exactly this, in the same fix, #6478). Under `"num_items_in_batch"`
`factor = 1`, as stock `GKDTrainer`: each process divides its own loss sum by the count transformers handed it
(the global one with `average_tokens_across_devices`, its own without) and DDP averages the gradients, so with N
processes and a global count the step is 1/N of the one-process step — stock TRL's update, which a drop-in keeps
(`ThunderSyncGKDTrainer.compute_loss` leaves TRL's off-policy steps alone under this normalizer for the same reason).

Refusals, on every process alike (every count is in every `RankShare`): zero scored tokens under either convention
(`NoScoredTokensError`: the stream sampled nothing to learn from), and a `num_items_in_batch` of zero
(`NoScoredTokensError` naming it: stock TRL would divide by zero).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from ..errors import NoScoredTokensError

NormalizerName = Literal["num_items_in_batch", "scored_tokens"]


class _Counts(Protocol):
    scored_tokens: int
    num_items: float | None


@dataclass(frozen=True)
class StepNormalizer:
    """How one on-policy step's Σ_j g_j is normalized on this process."""

    name: NormalizerName  # the convention in use for this step (after any fallback)
    tokens: float  # this process's divisor: the shared count, or this process's own count
    factor: float  # multiplies this process's share before the placement's mean over processes (world or 1)
    fallback: str | None  # why `num_items_in_batch` was asked for and `scored_tokens` used, else None

    def describe(self) -> str:
        """What the run's log says this step is divided by."""
        if self.name == "num_items_in_batch":
            return ("num_items_in_batch (the dataset answers' label tokens of the window, as stock trl GKDTrainer; "
                    "huggingface/trl #6452)")
        return "the scored completion tokens (as trl's DistillationTrainer)"

    def share_scale(self, seeded_by: float | None = None) -> float:
        """What this process's Σ_j g_j is multiplied by. `seeded_by`: the count its backwards already divided by
        (`num_items_in_batch` is known before the batch, so each turn's loss is divided by it before its backward,
        as stock TRL seeds its backward with 1/N: the same rounding, not a second division at the barrier)."""
        if seeded_by is None:
            return self.factor / self.tokens
        if self.tokens == seeded_by:
            return self.factor
        return self.factor * seeded_by / self.tokens


def step_normalizer(requested: NormalizerName, shares: Sequence[_Counts], rank: int, *, label: str,
                    allow_empty: bool = False) -> StepNormalizer:
    """The normalizer of one streamed step from every process's share (the same answer, or error, everywhere).

    Each process divides by the `num_items_in_batch` it holds (the global count when transformers gathered it over
    the processes, `average_tokens_across_devices`; else its own), as stock GKD does. `label` names the
    step in errors ("optimizer step 3 (policy version 3)"). `allow_empty`: one on-policy micro-step of a window that
    also holds TRL's off-policy micro-steps (lmbda < 1 with accumulation): zero scored tokens add nothing there, as
    in stock TRL, and the window's own count (never 0 here) is the divisor."""
    world = len(shares)
    scored = sum(s.scored_tokens for s in shares)
    if scored == 0 and not (allow_empty and requested == "num_items_in_batch"):
        raise NoScoredTokensError(
            f"{label}: the on-policy batch closed with zero scored completion tokens (every completion was empty), "
            f"so there is nothing to distill and the optimizer step is refused (on_policy_normalizer={requested!r}). "
            "Check max_new_tokens and the agent limits")
    if requested == "scored_tokens":
        return StepNormalizer("scored_tokens", float(scored), float(world), None)
    counts = [s.num_items for s in shares]
    if any(c is None for c in counts):
        why = ("transformers handed training_step no num_items_in_batch (prompt-only rows without labels, or a "
               "model whose forward takes no loss kwargs), so the scored-token count is used")
        if scored == 0:
            raise NoScoredTokensError(f"{label}: zero scored completion tokens and no num_items_in_batch: {why}, "
                                      "and it is 0; the optimizer step is refused")
        return StepNormalizer("scored_tokens", float(scored), float(world), why)
    if any(c <= 0 for c in counts):
        bad = next(i for i, c in enumerate(counts) if c <= 0)
        raise NoScoredTokensError(
            f"{label}: num_items_in_batch={counts[bad]:g} on process {bad}: the dataset rows of this accumulation "
            "window have no answer tokens, and on_policy_normalizer='num_items_in_batch' (stock GKDTrainer's "
            "normalizer) would divide by zero; the optimizer step is refused. Use on_policy_normalizer="
            "'scored_tokens' or rows with answers")
    return StepNormalizer("num_items_in_batch", float(counts[rank]), 1.0, None)  # shared or own count alike


def step_loss(shares: Sequence, normalizer_of) -> float:
    """The step's reported loss: the mean over processes of factor · loss_r / tokens_r (Σ loss / N for a shared
    count: what one process streaming the whole batch reports). `normalizer_of(rank)` gives each rank's normalizer."""
    return sum(s.loss_sum * normalizer_of(s.rank).share_scale() for s in shares) / len(shares)
