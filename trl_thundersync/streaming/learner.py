"""The learner side of one logical GRPO batch: admission, per-source backward, group folds, the barrier.

Framework-agnostic: it receives `ScoredRollout`s (in whatever order they finish), asks an injected
`source_backward` for the source's gradients at the frozen θ_k, and keeps only group sufficient statistics and the
batch accumulator. It never touches an optimizer; `finish()` hands the barrier the accumulated terms.

Admission: at most `max_open_groups` groups hold statistics buffers at once. A source whose group is not open and
cannot open waits in `pending` (its tokens only, no gradient memory) until a group closes. Members of open groups
are always admitted, so admission can never deadlock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import BatchIncompleteError, StalePolicyError, UnscorableGroupError
from ..types import ScoredRollout
from .accumulators import BatchAccumulator, GroupStatistics


@dataclass(frozen=True)
class SourceGradients:
    """What one trajectory's backward produced at θ_k."""

    score_grad: torch.Tensor | None  # H_i = ∇ Σ_t m_it u_i log π(o_it), FP32 (P,); None for unscorable rows
    free_grad: torch.Tensor | None  # K_i: gradient of advantage-free terms (β·KL), FP32 (P,); None if none
    scored_tokens: int  # Σ_t m_it: tokens that count in loss normalizers
    free_value: float = 0.0  # value of the advantage-free loss term (Σ_t m_it u_i β KL_it), for logging
    kl_sum: float = 0.0  # Σ_t m_it KL_it (unweighted), for the `kl` metric


@dataclass(frozen=True)
class WorkItem:
    """One unit of learner work, for the trace and the scheduling model (paper Eq. 1)."""

    kind: str  # "trajectory" (source backward) or "group_fold"
    index: int  # trajectory index in the batch, or -1 for a group fold
    group: int
    policy_version: int
    ready: float  # τ: when its inputs were fixed (reward known / last member folded)
    start: float  # service start (perf_counter)
    end: float  # service end (perf_counter)
    tokens: int  # scored tokens (0 for folds)


@dataclass(frozen=True)
class BatchTotals:
    """Everything the barrier needs, fixed once every trajectory and group of the batch has closed."""

    accumulator: BatchAccumulator
    rewards: tuple[float, ...]  # per trajectory index, NaN for unscorable
    group_means: tuple[float, ...]
    group_stds: tuple[float, ...]
    scored_tokens: tuple[int, ...]  # per trajectory index
    free_values: tuple[float, ...]  # per trajectory index: SourceGradients.free_value
    kl_sums: tuple[float, ...]  # per trajectory index: SourceGradients.kl_sum
    work: tuple[WorkItem, ...]
    peak_stats_bytes: int  # high-water mark of group statistics + batch buffers


class GRPOBatchLearner:
    """Consumes the scored trajectories of one logical batch; see module docstring."""

    def __init__(
        self,
        *,
        batch_size: int,
        num_generations: int,
        num_params: int,
        policy_version: int,
        scale_rewards: str,
        source_backward: Callable[[ScoredRollout, int], SourceGradients],
        bucket_of: Callable[[int], int] = lambda index: 0,
        max_open_groups: int | None = None,
        allow_unscorable_groups: bool = False,
        eps: float = 1e-4,
        device: torch.device | str = "cpu",
    ) -> None:
        if batch_size % num_generations:
            raise ValueError(f"batch_size={batch_size} is not a multiple of num_generations={num_generations}")
        self.batch_size = batch_size
        self.num_generations = num_generations
        self.num_groups = batch_size // num_generations
        self.policy_version = policy_version
        self.scale_rewards = scale_rewards
        self.source_backward = source_backward
        self.bucket_of = bucket_of
        self.max_open_groups = max_open_groups or self.num_groups
        self.allow_unscorable_groups = allow_unscorable_groups
        self.eps = eps
        self.num_params = num_params
        self.accumulator = BatchAccumulator(num_params, device)
        self.open: dict[int, GroupStatistics] = {}
        self.closed: dict[int, GroupStatistics] = {}
        self.pending: list[ScoredRollout] = []
        self.seen: set[int] = set()
        self.rewards = [math.nan] * batch_size
        self.tokens = [0] * batch_size
        self.free_values = [0.0] * batch_size
        self.kl_sums = [0.0] * batch_size
        self.work: list[WorkItem] = []
        self.peak_bytes = 0

    # -- intake -------------------------------------------------------------------------------------------------
    def submit(self, source: ScoredRollout) -> None:
        """Admit one scored trajectory: check it, then run its backward now or park it until a group slot frees."""
        rollout = source.rollout
        if rollout.policy_version != self.policy_version:
            raise StalePolicyError(
                f"trajectory {rollout.index} (group {rollout.group}) was sampled with policy version "
                f"{rollout.policy_version}, but the learner is accumulating version {self.policy_version}; "
                "zero staleness forbids mixing versions in one update"
            )
        if not 0 <= rollout.index < self.batch_size or rollout.index in self.seen:
            raise BatchIncompleteError(f"trajectory index {rollout.index} is out of range or was delivered twice")
        if rollout.group != rollout.index // self.num_generations:
            raise BatchIncompleteError(
                f"trajectory {rollout.index} claims group {rollout.group}, expected {rollout.index // self.num_generations}"
            )
        self.seen.add(rollout.index)
        self.pending.append(source)
        self._drain()

    def _admissible(self, source: ScoredRollout) -> bool:
        group = source.rollout.group
        return group in self.open or len(self.open) < self.max_open_groups

    def _drain(self) -> None:
        progress = True
        while progress:
            progress = False
            for i, source in enumerate(self.pending):
                if self._admissible(source):
                    del self.pending[i]
                    self._serve(source)
                    progress = True
                    break

    def _serve(self, source: ScoredRollout) -> None:
        rollout = source.rollout
        group = self.open.get(rollout.group)
        if group is None:
            group = self.open[rollout.group] = GroupStatistics(rollout.group, self.num_generations, self.num_params)
        start = time.perf_counter()
        bucket = self.bucket_of(rollout.index)
        grads = self.source_backward(source, bucket)
        if grads.free_grad is not None:
            self.accumulator.add_free(grads.free_grad, bucket)
        group.add(source.reward, grads.score_grad, bucket)
        self.rewards[rollout.index] = source.reward
        self.tokens[rollout.index] = grads.scored_tokens
        self.free_values[rollout.index] = grads.free_value
        self.kl_sums[rollout.index] = grads.kl_sum
        end = time.perf_counter()
        self.work.append(
            WorkItem("trajectory", rollout.index, rollout.group, rollout.policy_version, source.scored_at, start, end,
                     grads.scored_tokens)
        )
        self._track_memory()
        if group.complete:
            self._close(group, ready=end)

    def _close(self, group: GroupStatistics, ready: float) -> None:
        if not group.scorable and not self.allow_unscorable_groups:
            raise UnscorableGroupError(
                f"every reward function returned None for all {group.size} trajectories of group {group.group} "
                f"(batch rows {group.group * group.size}..{(group.group + 1) * group.size - 1}); the group has no "
                "learning signal. Fix the reward functions, or set allow_unscorable_groups=True to give it zero "
                "advantage as trl.GRPOTrainer does"
            )
        start = time.perf_counter()
        if self.scale_rewards == "group":
            scale = 1.0 / (group.std + self.eps)
        else:  # "batch" applies 1/(σ_batch + eps) at the barrier; "none" never scales
            scale = 1.0
        self.accumulator.add_policy(group.fold(scale))
        group.free()
        del self.open[group.group]
        self.closed[group.group] = group
        self.work.append(WorkItem("group_fold", -1, group.group, self.policy_version, ready, start,
                                  time.perf_counter(), 0))

    def _track_memory(self) -> None:
        used = sum(g.nbytes() for g in self.open.values()) + self.accumulator.nbytes()
        self.peak_bytes = max(self.peak_bytes, used)

    # -- barrier ------------------------------------------------------------------------------------------------
    def finish(self) -> BatchTotals:
        """The barrier: every trajectory and group must have closed. Returns the totals for normalization."""
        self._drain()
        missing = sorted(set(range(self.batch_size)) - self.seen)
        if missing or self.pending or self.open:
            raise BatchIncompleteError(
                f"barrier reached with {len(missing)} trajectories never delivered (first: {missing[:5]}), "
                f"{len(self.pending)} parked and {len(self.open)} groups open; refusing a partial update"
            )
        groups = [self.closed[g] for g in range(self.num_groups)]
        return BatchTotals(
            accumulator=self.accumulator,
            rewards=tuple(self.rewards),
            group_means=tuple(g.mean for g in groups),
            group_stds=tuple(g.std for g in groups),
            scored_tokens=tuple(self.tokens),
            free_values=tuple(self.free_values),
            kl_sums=tuple(self.kl_sums),
            work=tuple(self.work),
            peak_stats_bytes=self.peak_bytes,
        )
