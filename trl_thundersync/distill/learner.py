"""The learner side of one logical distillation batch: scored turns in, Σ_j g_j and N_k out (paper Eq. 9).

Turns of one trajectory are processed in turn order (the boundary-cut backward extends the trajectory's state);
a turn that overtook its predecessor is parked until the predecessor arrives. A trajectory is closed — its deferred
context adjoints replayed — once the engine reported it finished *and* all of its turns were processed. Nothing is
normalized here: N_k is only known at the barrier (`batch_direction`).

Admission: at most `max_open_trajectories` trajectories are open (their first turn processed, not yet closed) at
once, which bounds the boundary-cut state they retain (key/value graphs and deferred adjoints). A trajectory whose
first item arrives while every slot is taken waits, its scored turns parked, and is admitted in arrival order when
an open one closes. The update is the same sum, in another order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..errors import BatchIncompleteError, ConfigurationError, NoScoredTokensError, StalePolicyError
from ..streaming.learner_records import TeacherInterval, WorkItem
from .records import DistillTotals, ScoredTurn, TrajectoryClosed
from .turn_backward import GradientSum, TurnBackward


@dataclass
class _Progress:
    next_turn: int = 0
    parked: dict[int, ScoredTurn] = field(default_factory=dict)
    closed: TrajectoryClosed | None = None
    replayed: bool = False


class DistillBatchLearner:
    def __init__(self, *, batch_size: int, policy_version: int, backward: TurnBackward, grads: GradientSum,
                 max_open_trajectories: int | None = None) -> None:
        if max_open_trajectories is not None and max_open_trajectories < 1:
            raise ConfigurationError(
                f"max_open_trajectories={max_open_trajectories} must be ≥ 1 (or None for no cap)")
        self.batch_size = batch_size
        self.max_open = max_open_trajectories or batch_size
        self.open: set[int] = set()  # admitted, not yet closed: the trajectories that may hold backward state
        self.waiting: list[int] = []  # not admitted yet, in the order their first item arrived
        self.peak_open = 0
        self.policy_version = policy_version
        self.backward = backward
        self.grads = grads
        self.progress = [_Progress() for _ in range(batch_size)]
        self.scored_tokens = 0
        self.loss_sum = 0.0
        self.turns = 0
        self.work: list[WorkItem] = []

    def submit(self, item: ScoredTurn | TrajectoryClosed) -> None:
        if isinstance(item, ScoredTurn):
            self._check(item.event.index, item.event.policy_version, f"turn {item.event.turn}")
            progress = self.progress[item.event.index]
            if item.event.turn < progress.next_turn or item.event.turn in progress.parked:
                raise BatchIncompleteError(f"trajectory {item.event.index} turn {item.event.turn} was delivered twice")
            if progress.replayed:
                raise BatchIncompleteError(f"trajectory {item.event.index} turn {item.event.turn} arrived after the "
                                           "trajectory was closed and replayed")
            progress.parked[item.event.turn] = item
        else:
            rollout = item.rollout
            self._check(rollout.index, rollout.policy_version, "the finished trajectory")
            progress = self.progress[rollout.index]
            if progress.closed is not None:
                raise BatchIncompleteError(f"trajectory {rollout.index} was reported finished twice")
            progress.closed = item
        index = item.event.index if isinstance(item, ScoredTurn) else item.rollout.index
        if index in self.open:
            self._advance(index)
        elif index not in self.waiting:
            self.waiting.append(index)
            self._admit_waiting()

    def _admit_waiting(self) -> None:
        while self.waiting and len(self.open) < self.max_open:
            index = self.waiting.pop(0)
            self.open.add(index)
            self.peak_open = max(self.peak_open, len(self.open))
            self._advance(index)

    def _advance(self, index: int) -> None:
        """Process an open trajectory's parked turns in order, and close it when it is complete."""
        progress = self.progress[index]
        while progress.next_turn in progress.parked:
            self._serve(progress.parked.pop(progress.next_turn))
            progress.next_turn += 1
        if self._maybe_close(index):
            self.open.discard(index)
            self._admit_waiting()

    def _check(self, index: int, version: int, what: str) -> None:
        if not 0 <= index < self.batch_size:
            raise BatchIncompleteError(f"trajectory index {index} is outside the batch of {self.batch_size}")
        if version != self.policy_version:
            raise StalePolicyError(
                f"trajectory {index}: {what} was sampled with policy version {version}, but the learner is "
                f"accumulating version {self.policy_version}; zero staleness forbids mixing versions in one update"
            )

    def _serve(self, scored: ScoredTurn) -> None:
        start = time.perf_counter()
        outcome = self.backward.turn(scored.event, scored.teacher)
        self.scored_tokens += outcome.scored_tokens
        self.loss_sum += outcome.loss_value
        self.turns += 1
        e = scored.event
        self.work.append(WorkItem("turn_backward", e.index, -1, e.policy_version, scored.scored_at, start,
                                  time.perf_counter(), outcome.scored_tokens, turn=e.turn,
                                  teacher=TeacherInterval(e.time, scored.scoring_start, scored.scored_at)))

    def _maybe_close(self, index: int) -> bool:
        progress = self.progress[index]
        closed = progress.closed
        if closed is None or progress.replayed or progress.next_turn < closed.turns:
            return False
        if progress.parked:
            raise BatchIncompleteError(f"trajectory {index} finished after {closed.turns} turns but turn(s) "
                                       f"{sorted(progress.parked)} were also delivered")
        start = time.perf_counter()
        replayed = self.backward.close(index)
        progress.replayed = True
        self.work.append(WorkItem("context_replay", index, -1, self.policy_version, closed.closed_at, start,
                                  time.perf_counter(), replayed))
        return True

    def finish(self) -> DistillTotals:
        """Every trajectory must have finished and been replayed; no turn may still be parked."""
        open_ = [i for i, p in enumerate(self.progress) if not p.replayed]
        if open_:
            p = self.progress[open_[0]]
            raise BatchIncompleteError(
                f"barrier reached with {len(open_)} trajectories not closed (first: {open_[0]}: finished="
                f"{p.closed is not None}, turns processed={p.next_turn}, parked={sorted(p.parked)}); refusing a "
                "partial update"
            )
        return DistillTotals(tuple(self.grads.buffers), self.scored_tokens, self.loss_sum, self.turns,
                             self.batch_size, tuple(self.work), self.peak_open)


def batch_direction(grads: tuple[torch.Tensor, ...], scored_tokens: int) -> list[torch.Tensor]:
    """Σ_j g_j / N_k (paper Eq. 9), applied once at the barrier."""
    if scored_tokens == 0:
        raise NoScoredTokensError(
            "the logical batch closed with zero scored action tokens (every turn's action was empty), so N_k = 0 and "
            "the token-normalized update is undefined; the optimizer step is refused. Check max_new_tokens and the "
            "agent limits"
        )
    return [g / scored_tokens for g in grads]
