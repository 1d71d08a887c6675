"""Frozen records of the distillation path: teacher scores, scored turns, closed trajectories, batch totals (its learner
work items are `streaming.learner_records.WorkItem`s, with the teacher lane)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..streaming.learner_records import WorkItem
from ..types import Rollout, TurnEvent


@dataclass(frozen=True)
class TeacherScores:
    """What the frozen teacher says about one turn's action tokens a_1..a_T in their realized context."""

    logprobs: torch.Tensor  # (T,) FP32: log π_T(a_t | h_t) of the sampled tokens
    logits: torch.Tensor | None = None  # (T, V) FP32 teacher logits at the action positions; None when the teacher
    # only returns sampled-token log-probs (a server), which is enough for OPD but not for the generalized JSD


@dataclass(frozen=True)
class ScoredTurn:
    """A turn whose teacher scores are known: one OPD/GKD learner source, released at `scored_at`."""

    event: TurnEvent  # the agent loop's turn (context tokens, action tokens, policy version)
    teacher: TeacherScores
    scoring_start: float  # perf_counter when the teacher started on it; queue wait = scoring_start − event.time
    scored_at: float  # perf_counter when the scores were known: the source's ready time τ
    shared: bool = False  # the teacher scored it in one request with other turns of its trajectory (same interval)


@dataclass(frozen=True)
class TrajectoryClosed:
    """The rollout engine finished a trajectory; its deferred context backward may run once all turns are in."""

    rollout: Rollout
    turns: int  # turn events the trajectory emitted (its last turn closes it)
    closed_at: float  # perf_counter


@dataclass(frozen=True)
class DistillTotals:
    """Everything the barrier needs once every turn and trajectory of the batch has been processed."""

    grads: tuple[torch.Tensor, ...]  # Σ_j g_j per trainable parameter, FP32, not yet divided by N_k
    scored_tokens: int  # N_k (this process)
    loss_sum: float  # Σ over scored tokens of the per-token loss value (OPD: −A; GJSD: the divergence)
    turns: int  # turns processed
    trajectories: int
    work: tuple[WorkItem, ...]  # "turn_backward" items (each with its `TeacherInterval`) and "context_replay" items
    peak_open_trajectories: int  # most trajectories open (holding backward state) at once; ≤ the admission cap
