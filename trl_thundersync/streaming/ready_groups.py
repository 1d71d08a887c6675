"""A group's last members, ready together, learned in padded passes (`GRPOBatchLearner.submit_ready`).

When the learner takes the remaining members of a group at once (`coalesce.gather_members` gathers them while it is
busy; the sync schedule hands it the whole batch), the group's rewards, μ and σ, and so every advantage
A_i = (R_i − μ)·scale, are fixed. The injected `group_backward` (`source_batch.py`) then runs them as right-padded
passes with one backward of Σ_i A_i·S_i per destination, instead of one pass per member; their terms go straight into
the batch accumulator (the policy term with its advantages in it, so the group's fold adds only its earlier members'
G1, G2), their rewards into the group's statistics. Exact up to FP32 rounding, like one pass per member.

A mixin of `GRPOBatchLearner`: it reads and updates the learner's state (`open`, `seen`, `buffered`, `turning`,
`pending`, `accumulator`, `tallies`, `prefixes`, `work`) through the learner's own methods where there is one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from ..types import ScoredRollout
from .accumulators import GroupStatistics, nanmean, nanstd_bessel
from .learner_records import GroupBatch, WorkItem


class GroupBatching:
    """`submit_ready`, `completes_group`: see the module docstring."""

    def submit_ready(self, sources: Sequence[ScoredRollout]) -> None:
        """Scored trajectories that were ready together, in arrival order (`coalesce.gather_members`, or the sync
        schedule's whole batch). Where they are the last members of their group, the group's advantages are fixed
        and they are learned in padded passes (`group_backward`; a member released at its content binds first); the
        others are `submit`ted one by one."""
        by_group: dict[int, list[ScoredRollout]] = {}
        for source in sources:
            by_group.setdefault(source.rollout.group, []).append(source)
        for group, members in by_group.items():
            bound = [m for m in members if m.rollout.index in self.buffered and m.rollout.index not in self.seen]
            for source in bound:  # released at its content: its H_i binds, as alone
                self.submit(source)
            rest = [m for m in members if m not in bound]
            if not (len(rest) > 1 and self._serve_together(group, rest)):
                for source in rest:
                    self.submit(source)

    def completes_group(self, group: int, indices: Sequence[int]) -> bool:
        """Whether the scored trajectories `indices` would complete group `group`, at least two of them then learned
        as one padded pass (the others bind the H_i their content release left); `coalesce.gather_members` asks
        before it gathers them."""
        if self.group_backward is None:
            return False
        stats = self.open.get(group)
        held = len(stats.rewards) if stats is not None else 0
        fresh = [i for i in indices if i not in self.buffered]
        return len(fresh) > 1 and held + len(indices) == self.num_generations and not any(
            p.rollout.group == group for p in self.pending)

    def _serve_together(self, group: int, members: list[ScoredRollout]) -> bool:
        """`members` complete group `group`: learned in the group's padded passes (True), or nothing done (False)."""
        stats = self.open.get(group)
        indices = [m.rollout.index for m in members]
        if (not self.completes_group(group, indices) or not self._admissible(members[0])
                or len(set(indices)) != len(indices)
                or any(i in self.seen or i in self.buffered or i in self.turning for i in indices)):
            return False
        for m in members:
            self._check(m.rollout.index, m.rollout.group, m.rollout.policy_version, "the scored trajectory")
        if self.prefixes is not None:
            self._open_prefix(group, members[0].rollout.prompt_ids, max(m.scored_at for m in members))
        rewards = [*(stats.rewards if stats is not None else []), *(m.reward for m in members)]
        scale = self.scaling.group_scale(nanstd_bessel(rewards))
        mean = nanmean(rewards)
        advantages = [None if not m.scorable else
                      (m.reward - mean) * scale if math.isfinite(scale) else 0.0 for m in members]
        buckets = [self.bucket_of(i) for i in indices]
        start = time.perf_counter()
        batch = self.group_backward([m.rollout for m in members], advantages, buckets,
                                    [self._micro_batch(i) for i in indices])
        if batch is None:
            return False
        end = time.perf_counter()
        stats = self._record_batch(group, stats, members, buckets, batch, start, end)
        self._track_memory()
        self._close(stats, ready=end)
        return True

    def _record_batch(self, group: int, stats: GroupStatistics | None, members: list[ScoredRollout],
                      buckets: list[int], batch: GroupBatch, start: float, end: float) -> GroupStatistics:
        """Fold a group batch's terms (the policy term per bucket, β·KL, entropy; its prefix adjoints) and each
        member's reward and scalars into the group's statistics (returned, opened here if needed); one work item
        per member, with its share of the passes' time and FLOPs."""
        if stats is None:
            stats = self.open[group] = GroupStatistics(group, self.num_generations, self.num_params)
        if self.prefixes is not None:
            self.prefixes.add_batch(group, batch.adjoints, [(m.reward if m.scorable else float("nan"), b)
                                                             for m, b in zip(members, buckets, strict=True)])
        for (channel, key), vector in batch.vectors.items():
            if channel == "policy":
                self.accumulator.add_policy({key: vector})
            elif channel == "free":
                self.accumulator.add_free(vector, key)
            else:
                self._add_entropy_term(key, vector)
        sizes = {i: len(chunk) for chunk in batch.ran for i in chunk}  # the rows of the pass each member ran in
        tokens = [len(m.rollout.completion_ids) if m.rollout.index in sizes else 0 for m in members]
        at = start
        for m, bucket, row, n in zip(members, buckets, batch.rows, tokens, strict=True):
            index = m.rollout.index
            self.seen.add(index)
            self.reward_times[index] = m.scored_at
            self._router_aux(m.rollout, m.scored_at)
            stats.add(m.reward if m.scorable else float("nan"), None, bucket)
            self.tallies.record(index, row)
            self.tallies.rewards[index] = m.reward
            share = n / max(sum(tokens), 1)  # the pass's time and FLOPs, attributed by forwarded tokens
            self.work.append(WorkItem("trajectory", index, group, m.rollout.policy_version, m.scored_at, at,
                                      at + share * (end - start), row.scored_tokens,
                                      content_ready=m.rollout.finished_at,
                                      reward_at=m.scored_at, batched=sizes.get(index, 0),
                                      flops=batch.flops * share if batch.flops is not None else None))
            at += share * (end - start)
        return stats
