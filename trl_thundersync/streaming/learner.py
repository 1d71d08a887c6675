"""The learner side of one logical GRPO batch: admission, per-source backward, reward binding, group folds, barrier.

Framework-agnostic: it receives, in whatever order they happen, `TurnEvent`s (`submit_turn`), finished trajectories
(`submit_content`) and `ScoredRollout`s (`submit`); asks an injected `source_backward` / `content_backward` /
`turn_source` for the gradients at the frozen θ_k, and keeps only group sufficient statistics, the batch accumulator
and — for trajectories released before their reward (`release.py`) — one H_i buffer each until the reward binds. It
never touches an optimizer; `finish()` hands the barrier the accumulated terms.

Admission: at most `max_open_groups` groups hold statistics buffers at once. A scored source whose group is not open
and cannot open waits in `pending` (a content-released one keeps its H_i buffer) until a group closes. Members of
open groups are always admitted, and every member's reward eventually arrives, so admission can never deadlock. At
most `max_buffered` trajectories hold an H_i buffer or per-turn state; the others are released at their reward.

Options, each in its own module: `objective_weights` (normalize_then_sum, `objectives.py`: per-function group
statistics, batch mean and std at the barrier); `off_policy_threshold` (TRL's off-policy sequence mask,
`off_policy_mask.py`: a masked trajectory's H_i stays out of G1/G2 and folds or drops at its group's close, or at the
barrier under normalize_then_sum); `router_aux` (MoE, `moe_aux.py`: every trajectory's final tokens, one
load-balancing backward per TRL micro-batch); `entropy_micro_batch_of` (TRL's entropy bonus: E_i summed per TRL
micro-batch, normalized at the barrier); `prefixes` (`prefix_groups.py`: each group's prompt learned once);
`group_backward` (`ready_groups.py`, `source_batch.py`: a group's last members, ready together, in padded passes).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from ..errors import BatchIncompleteError, StalePolicyError, UnscorableGroupError
from ..types import Rollout, ScoredRollout, TurnEvent
from .accumulators import BatchAccumulator, GroupStatistics
from .advantages import RewardScaling
from .learner_records import BatchTotals, SourceGradients, TrajectoryTallies, WorkItem
from .moe_aux import RouterAuxLoss
from .objectives import ObjectiveGroupStatistics
from .off_policy_mask import OffPolicyMask
from .prefix_groups import PrefixGroups
from .ready_groups import GroupBatching
from .release import Buffered, TurnSource, check_learner_arguments, vector_bytes

if TYPE_CHECKING:
    from .source_batch import GroupBackward

__all__ = ["BatchTotals", "GRPOBatchLearner", "SourceGradients", "WorkItem"]


class GRPOBatchLearner(GroupBatching):
    """Consumes the trajectories of one logical batch (content, turns, rewards); see module docstring."""

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
        release: str = "reward",
        content_backward: Callable[[Rollout, int], SourceGradients] | None = None,
        turn_source: TurnSource | None = None,
        max_buffered: int | None = None,
        router_aux: RouterAuxLoss | None = None,
        entropy_micro_batch_of: Callable[[int], int] | None = None,
        off_policy_threshold: float | None = None,
        objective_weights: tuple[float, ...] | None = None,
        prefixes: PrefixGroups | None = None,
        group_backward: GroupBackward | None = None,
    ) -> None:
        check_learner_arguments(batch_size, num_generations, release, content_backward, turn_source)
        if prefixes is not None and (off_policy_threshold is not None or objective_weights is not None):
            raise ValueError("shared prefixes cover every release point, without the off-policy mask and "
                             "normalize_then_sum")
        self.batch_size = batch_size
        self.num_generations = num_generations
        self.num_groups = batch_size // num_generations
        self.policy_version = policy_version
        self.scaling = RewardScaling(scale_rewards, eps)  # the group fold's σ here, the batch σ at the barrier
        self.source_backward = source_backward
        self.bucket_of = bucket_of
        self.max_open_groups = max_open_groups or self.num_groups
        self.allow_unscorable_groups = allow_unscorable_groups
        self.num_params = num_params
        self.release = release
        self.content_backward = content_backward
        self.turn_source = turn_source
        self.max_buffered = max_buffered or batch_size
        self.router_aux = router_aux
        self.entropy_micro_batch_of = entropy_micro_batch_of
        self.entropy_terms: dict[int, torch.Tensor] = {}  # Σ_{i∈b} E_i per TRL micro-batch b
        self.objective_weights = objective_weights  # normalize_then_sum (`objectives.py`); None: sum_then_normalize
        self.off_policy = OffPolicyMask(off_policy_threshold, defer=objective_weights is not None)
        self.tallies = TrajectoryTallies.empty(batch_size)  # per-row values for the barrier
        self.accumulator = BatchAccumulator(num_params, device)
        self.open: dict[int, GroupStatistics] = {}
        self.closed: dict[int, GroupStatistics] = {}
        self.pending: list[ScoredRollout] = []
        self.seen: set[int] = set()
        self.buffered: dict[int, Buffered] = {}  # content released, waiting for the reward
        self.turning: set[int] = set()  # holding per-turn state (release="turn")
        self.turns_refused: set[int] = set()  # found no slot at their first turn: no per-turn release
        self.content_seen: set[int] = set()
        self.reward_times: dict[int, float] = {}
        self.turn_fallbacks = 0  # turn-released trajectories recomputed whole (history mismatch)
        self.peak_held = 0  # most trajectories holding a buffer or per-turn state at once
        self.work: list[WorkItem] = []
        self.peak_bytes = 0
        self.prefixes = prefixes  # the shared prefixes the source backwards read (None: full passes only)
        # a group's last members, ready together, in one padded pass (`source_batch.py`; None: one pass each)
        self.group_backward = group_backward if objective_weights is None and off_policy_threshold is None else None
        self.peak_prefix_bytes = 0

    # -- intake -------------------------------------------------------------------------------------------------
    def _check(self, index: int, group: int, version: int, what: str) -> None:
        if version != self.policy_version:
            raise StalePolicyError(
                f"{what} of trajectory {index} (group {group}) was sampled with policy version {version}, but the "
                f"learner is accumulating version {self.policy_version}; zero staleness forbids mixing versions in "
                "one update"
            )
        if not 0 <= index < self.batch_size:
            raise BatchIncompleteError(f"trajectory index {index} is out of range (batch of {self.batch_size})")
        if group != index // self.num_generations:
            raise BatchIncompleteError(
                f"trajectory {index} claims group {group}, expected {index // self.num_generations}")

    def _holding(self) -> int:
        return len(self.buffered) + len(self.turning) + self.off_policy.held()

    def submit_turn(self, event: TurnEvent) -> None:
        """Release="turn": one turn's action is complete; run its backward now if the trajectory holds a slot."""
        self.submit_turns((event,))

    def submit_turns(self, events: Sequence[TurnEvent]) -> None:
        """Release="turn": consecutive turns of one trajectory, all complete (`coalesce.py`: ready together while
        the learner was busy); their backward runs as one segment (`TurnSource.turns`), exact like turn by turn."""
        first = events[0]
        for event in events:
            self._check(event.index, first.index // self.num_generations, event.policy_version, f"turn {event.turn}")
        if self.release != "turn" or first.index in self.turns_refused:
            return
        if first.index in self.content_seen:
            raise BatchIncompleteError(f"trajectory {first.index} turn {first.turn} arrived after its last turn ended")
        if first.index not in self.turning:
            if self._holding() >= self.max_buffered:
                self.turns_refused.add(first.index)
                return
            self.turning.add(first.index)
            self._open_prefix(first.index // self.num_generations, first.context_ids, first.time)
        start = time.perf_counter()
        if len(events) > 1:
            self.turn_source.turns(events)
        else:
            self.turn_source.turn(first)
        self.work.append(WorkItem("turn", first.index, first.index // self.num_generations, first.policy_version,
                                  events[-1].time, start, time.perf_counter(),
                                  sum(len(e.action_ids) for e in events), turn=first.turn, turns=len(events),
                                  flops=getattr(self.turn_source, "last_flops", None)))
        self._track_memory()

    def submit_content(self, rollout: Rollout) -> None:
        """Release="content"/"turn": the trajectory's tokens are final; compute H_i now if it holds (or gets) a slot.

        K_i (β·KL) does not depend on the reward and goes straight into the batch accumulator; H_i waits in a
        buffer until `submit` brings the reward. Without a slot the trajectory is released at its reward."""
        self._check(rollout.index, rollout.group, rollout.policy_version, "the finished trajectory")
        if rollout.index in self.content_seen or rollout.index in self.seen:
            raise BatchIncompleteError(f"trajectory {rollout.index} was reported finished twice (or after its reward)")
        self.content_seen.add(rollout.index)
        self._router_aux(rollout, rollout.finished_at or time.perf_counter())
        if self.release == "reward":
            return
        bucket = self.bucket_of(rollout.index)
        start = time.perf_counter()
        ready = rollout.finished_at or start  # an engine that does not stamp its rollouts: ready when it arrived
        if rollout.index in self.turning:
            self.turning.discard(rollout.index)
            grads, kind = self.turn_source.finish(rollout, bucket), "close"
            flops = getattr(self.turn_source, "last_flops", None)
            if grads is None:
                self.turn_fallbacks += 1
                grads, kind = self.content_backward(rollout, bucket), "content"
        elif self._holding() < self.max_buffered:
            self._open_prefix(rollout.group, rollout.prompt_ids, ready)
            start = time.perf_counter()
            grads, kind = self.content_backward(rollout, bucket), "content"
        else:
            return
        if self.prefixes is not None:
            self.prefixes.hold(rollout.index, rollout.group, grads.prefix, bucket, self._micro_batch(rollout.index))
        if grads.free_grad is not None:
            self.accumulator.add_free(grads.free_grad, bucket)
        self._add_entropy(rollout.index, grads)
        self.tallies.record(rollout.index, grads)
        # K_i and E_i are folded already: keep only H_i, so the buffer holds one vector (release.vector_bytes)
        self.buffered[rollout.index] = Buffered(replace(grads, free_grad=None, entropy_grad=None, prefix=None), ready)
        if kind != "close":
            flops = grads.prefix.flops if grads.prefix is not None else None
        self.work.append(WorkItem(kind, rollout.index, rollout.group, rollout.policy_version, ready, start,
                                  time.perf_counter(), grads.scored_tokens, content_ready=ready, flops=flops))
        self._track_memory()

    def submit(self, source: ScoredRollout) -> None:
        """Admit one scored trajectory: check it, then run (or bind) its backward now, or park it for a group slot."""
        rollout = source.rollout
        self._check(rollout.index, rollout.group, rollout.policy_version, "the scored trajectory")
        if rollout.index in self.seen:
            raise BatchIncompleteError(f"trajectory index {rollout.index} was delivered twice")
        self.seen.add(rollout.index)
        self.reward_times[rollout.index] = source.scored_at
        self._router_aux(rollout, source.scored_at)  # no-op when its content was submitted already
        self.pending.append(source)
        self._drain()

    def _router_aux(self, rollout: Rollout, ready: float) -> None:
        if self.router_aux is None:
            return
        start = time.perf_counter()
        tokens = self.router_aux.add(rollout)
        if tokens is None:
            return
        self.work.append(WorkItem("router_aux", -1, -1, self.policy_version, ready, start, time.perf_counter(),
                                  tokens))
        self._track_memory()

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

    def _add_entropy(self, index: int, grads: SourceGradients) -> None:
        if grads.entropy_grad is None:
            return
        if self.entropy_micro_batch_of is None:
            raise ValueError("an entropy gradient arrived, but the learner has no entropy_micro_batch_of")
        self._add_entropy_term(self.entropy_micro_batch_of(index), grads.entropy_grad)

    def _add_entropy_term(self, micro_batch: int, vector: torch.Tensor) -> None:
        if micro_batch in self.entropy_terms:
            self.entropy_terms[micro_batch].add_(vector)
        else:
            self.entropy_terms[micro_batch] = vector.clone()

    def _serve(self, source: ScoredRollout) -> None:
        rollout = source.rollout
        group = self.open.get(rollout.group)
        if group is None:
            if self.objective_weights is not None:
                group = ObjectiveGroupStatistics(rollout.group, self.num_generations, self.num_params,
                                                 self.objective_weights)
            else:
                group = GroupStatistics(rollout.group, self.num_generations, self.num_params)
            self.open[rollout.group] = group
        start = time.perf_counter()
        bucket = self.bucket_of(rollout.index)
        held = self.buffered.pop(rollout.index, None)
        if held is not None:  # content released: bind H_i to its reward (dropped when the row is unscorable)
            self._add(group, source, held.grads, held.grads.score_grad if source.scorable else None, bucket)
            if self.prefixes is not None:
                self.prefixes.bind(rollout.index, rollout.group, source.reward if source.scorable else float("nan"),
                                   bucket)
            kind, tokens, content_ready, flops = "bind", 0, held.content_ready, None
        else:
            if rollout.index in self.turning:  # its content was never reported: drop the per-turn state
                self.turning.discard(rollout.index)
                self.turn_source.discard(rollout.index)
            self._open_prefix(rollout.group, rollout.prompt_ids, source.scored_at)
            start = time.perf_counter()
            grads = self.source_backward(source, bucket)
            if self.prefixes is not None:
                self.prefixes.add(rollout.group, grads.prefix, source.reward if source.scorable else float("nan"),
                                  bucket, self._micro_batch(rollout.index))
            if grads.free_grad is not None:
                self.accumulator.add_free(grads.free_grad, bucket)
            self._add_entropy(rollout.index, grads)
            self._add(group, source, grads, grads.score_grad, bucket)
            self.tallies.record(rollout.index, grads)
            kind, tokens, content_ready = "trajectory", grads.scored_tokens, rollout.finished_at
            flops = grads.prefix.flops if grads.prefix is not None else None
        self.tallies.rewards[rollout.index] = source.reward
        end = time.perf_counter()
        self.work.append(WorkItem(kind, rollout.index, rollout.group, rollout.policy_version, source.scored_at, start,
                                  end, tokens, content_ready=content_ready, reward_at=source.scored_at, flops=flops))
        self._track_memory()
        if group.complete:
            self._close(group, ready=end)

    def _add(self, group, source: ScoredRollout, grads: SourceGradients, score_grad, bucket: int) -> None:
        index = source.rollout.index
        score_grad = self.off_policy.hold(index, bucket, grads, score_grad)
        if isinstance(group, ObjectiveGroupStatistics):
            group.add(source.reward, score_grad, bucket, index=index, rewards_per_func=source.rewards_per_func)
        else:
            group.add(source.reward, score_grad, bucket)

    def _close(self, group: GroupStatistics, ready: float) -> None:
        if not group.scorable and not self.allow_unscorable_groups:
            raise UnscorableGroupError(
                f"every reward function returned None for all {group.size} trajectories of group {group.group} "
                f"(batch rows {group.group * group.size}..{(group.group + 1) * group.size - 1}); the group has no "
                "learning signal. Fix the reward functions, or set allow_unscorable_groups=True to give it zero "
                "advantage as trl.GRPOTrainer does"
            )
        start = time.perf_counter()
        if isinstance(group, ObjectiveGroupStatistics):  # Σ R_i H_i and Q; μ_B, σ_B at the barrier
            scale = 1.0
            weighted, scorable_sum = group.fold()
            self.accumulator.add_policy(weighted)
            self.accumulator.add_offset(scorable_sum)
            for index, value in group.normalized().items():
                self.tallies.objective_rewards[index] = value
        else:
            scale = self.scaling.group_scale(group.std)  # "batch": 1/(σ_B + eps) at the barrier (`advantages.py`)
            self.accumulator.add_policy(group.fold(scale))
        first = group.group * self.num_generations  # off-policy masked members: fold, drop or defer (TRL's mask)
        self.off_policy.close(range(first, first + self.num_generations), self.tallies.rewards, group.mean, scale,
                              self.accumulator)
        group.free()
        del self.open[group.group]
        self.closed[group.group] = group
        self.work.append(WorkItem("group_fold", -1, group.group, self.policy_version, ready, start,
                                  time.perf_counter(), 0))
        if not isinstance(group, ObjectiveGroupStatistics):  # its own item, after the fold's (no overlap)
            self._close_prefix(group.group, scale)

    def _micro_batch(self, index: int) -> int:
        return self.entropy_micro_batch_of(index) if self.entropy_micro_batch_of is not None else 0

    def _open_prefix(self, group: int, prompt_ids: Sequence[int], ready: float) -> None:
        """Before a member's backward (or first turn): its group's shared prefix, forwarded once."""
        item = self.prefixes.open_item(group, prompt_ids, ready, self.policy_version) if self.prefixes else None
        if item is not None:
            self.work.append(item)
            self._track_memory()

    def _close_prefix(self, group: int, scale: float) -> None:
        """The group's coefficients are fixed: one backward through its prefix."""
        if self.prefixes is not None:
            item = self.prefixes.close_item(group, scale, self.accumulator, self.entropy_terms, self.policy_version)
            self.work.extend([item] if item is not None else [])

    def _track_memory(self) -> None:
        used = sum(g.nbytes() for g in self.open.values()) + self.accumulator.nbytes()
        used += sum(vector_bytes(b.grads) for b in self.buffered.values())
        used += self.off_policy.nbytes()
        if self.router_aux is not None:
            used += self.router_aux.nbytes()
        used += sum(v.numel() * 4 for v in self.entropy_terms.values())
        if self.turn_source is not None:
            used += self.turn_source.held_bytes()
        self.peak_bytes = max(self.peak_bytes, used)
        if self.prefixes is not None:  # activations, not statistics: their own mark (max_open_groups bounds them)
            self.peak_prefix_bytes = max(self.peak_prefix_bytes, self.prefixes.held_bytes())
        self.peak_held = max(self.peak_held, self._holding())

    def abort(self) -> None:
        """Free every buffer and per-turn state of a void batch (the optimizer step will not happen)."""
        for index in sorted(self.turning):
            self.turn_source.discard(index)
        self.turning.clear()
        self.buffered.clear()
        self.entropy_terms.clear()
        self.off_policy.clear()
        if self.prefixes is not None:
            self.prefixes.discard()
        if self.router_aux is not None:
            self.router_aux.abort()

    # -- barrier ------------------------------------------------------------------------------------------------
    def finish(self) -> BatchTotals:
        """The barrier: every trajectory and group must have closed. Returns the totals for normalization."""
        self._drain()
        missing = sorted(set(range(self.batch_size)) - self.seen)
        if missing or self.pending or self.open or self.buffered or self.turning:
            waiting = sorted(self.buffered) or sorted(self.turning)
            self.abort()
            raise BatchIncompleteError(
                f"barrier reached with {len(missing)} trajectories never delivered (first: {missing[:5]}), "
                f"{len(self.pending)} parked, {len(self.open)} groups open and {len(waiting)} released trajectories "
                f"whose reward never arrived (first: {waiting[:5]}); refusing a partial update"
            )
        groups = [self.closed[g] for g in range(self.num_groups)]
        router_aux = self.router_aux.finish() if self.router_aux is not None else None
        return BatchTotals(
            accumulator=self.accumulator,
            group_means=tuple(g.mean for g in groups),
            group_stds=tuple(g.std for g in groups),
            work=tuple(replace(w, reward_at=self.reward_times.get(w.index)) if w.kind in ("content", "close", "turn")
                       else w for w in self.work),
            peak_stats_bytes=self.peak_bytes,
            scaling=self.scaling,
            peak_held=self.peak_held,
            turn_fallbacks=self.turn_fallbacks,
            peak_prefix_bytes=self.peak_prefix_bytes,
            router_aux=router_aux,
            entropy_terms=dict(self.entropy_terms) if self.entropy_micro_batch_of is not None else None,
            deferred=tuple(self.off_policy.deferred),
            off_policy_dropped=tuple(self.off_policy.dropped),
            **self.tallies.frozen(self.objective_weights is not None),
        )
