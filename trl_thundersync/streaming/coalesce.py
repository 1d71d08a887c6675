"""Ready work taken together. Turns: under `release="turn"` a busy learner finds several turns of one trajectory waiting
(its tool calls are faster than the learner); they are learned as one segment (`BoundaryCut.turns`) instead of one
forward/backward each, which saves the per-call cost and the second backward of every segment but the last. Exact:
the turns' objectives are sums over their action tokens, so one segment's gradient is the sum of the turns' up to
FP32 rounding. A free learner still takes each turn as it comes; a busy one's per-trajectory work tends to one
whole-trajectory pass, the cost of `release="content"`.

Members: under `release="content"` or `"reward"`, the scored trajectories of one group waiting together become one
`ReadyMembers`; when they are the last of their group, the learner runs them as one padded pass over the group's
shared prefix with their advantages folded in (`GRPOBatchLearner.submit_ready`, `prefix_batch.py`). A member whose
content is waiting too is learned there, at its reward, instead of alone at its content.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..types import Rollout, ScoredRollout, TurnEvent


@dataclass(frozen=True)
class CoalescedTurns:
    """Consecutive turns of one trajectory, all complete when the learner took them."""

    events: tuple[TurnEvent, ...]  # in turn order, one trajectory, at least two


def take_ready(inbox: queue.Queue, items: list, done: Any) -> list:
    """`items` and every item already waiting in `inbox` behind them, up to and including `done`, without blocking."""
    while not items or items[-1] is not done:
        try:
            items.append(inbox.get_nowait())
        except queue.Empty:
            break
    return items


def coalesce_turns(items: list) -> list:
    """`items` with each trajectory's consecutive turns among them (single `TurnEvent`s or `CoalescedTurns` already
    merged) merged into one `CoalescedTurns`, at the place of the first (nothing of that trajectory lies between them:
    its content and reward come after its last turn). Nothing moves ahead of a producer's failure."""
    out: list = []
    at: dict[int, int] = {}  # trajectory -> position in `out` of its open run of turns
    for item in items:
        events = item.events if isinstance(item, CoalescedTurns) else (item,) if isinstance(item, TurnEvent) else None
        if events is None:
            if isinstance(item, BaseException):
                at.clear()
            out.append(item)
            continue
        slot = at.get(events[0].index)
        if slot is not None and out[slot][-1].turn + 1 == events[0].turn:
            out[slot].extend(events)
            continue
        at[events[0].index] = len(out)
        out.append(list(events))
    return [(x[0] if len(x) == 1 else CoalescedTurns(tuple(x))) if isinstance(x, list) else x for x in out]


@dataclass(frozen=True)
class ReadyMembers:
    """Scored trajectories of one group, all waiting when the learner took them, in arrival order."""

    sources: tuple[ScoredRollout, ...]  # at least two, one group


def gather_members(items: list, completes: Callable[[int, list[int]], bool]) -> list:
    """`items` with the scored trajectories of each group among them (single `ScoredRollout`s or `ReadyMembers`
    already gathered) gathered into one `ReadyMembers`, at the place of the first, where `completes(group, indices)`
    says they are the last of their group (`GRPOBatchLearner.completes_group`); the waiting content (`Rollout`) of a
    gathered trajectory is dropped (it is learned at its reward). Nothing moves across a producer's failure."""
    groups: dict[int, list[ScoredRollout]] = {}
    for item in items:
        if isinstance(item, BaseException):
            break
        for source in item.sources if isinstance(item, ReadyMembers) else (item,) if isinstance(item, ScoredRollout) \
                else ():
            groups.setdefault(source.rollout.group, []).append(source)
    gathered = {g: m for g, m in groups.items() if len(m) > 1 and completes(g, [s.rollout.index for s in m])}
    indices = {s.rollout.index for m in gathered.values() for s in m}
    out: list = []
    placed: set[int] = set()
    failed = False
    for item in items:
        failed = failed or isinstance(item, BaseException)
        if failed:
            out.append(item)
            continue
        if isinstance(item, Rollout) and item.index in indices:
            continue
        sources = item.sources if isinstance(item, ReadyMembers) else (item,) if isinstance(item, ScoredRollout) \
            else None
        group = sources[0].rollout.group if sources else None
        if group not in gathered:
            out.append(item)
        elif group not in placed:
            placed.add(group)
            out.append(ReadyMembers(tuple(gathered[group])))
    return out
