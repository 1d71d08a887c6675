"""Ready turns taken together: under `release="turn"` a busy learner finds several turns of one trajectory waiting
(its tool calls are faster than the learner); they are learned as one segment (`BoundaryCut.turns`) instead of one
forward/backward each, which saves the per-call cost and the second backward of every segment but the last. Exact:
the turns' objectives are sums over their action tokens, so one segment's gradient is the sum of the turns' up to
FP32 rounding. A free learner still takes each turn as it comes; a busy one's per-trajectory work tends to one
whole-trajectory pass, the cost of `release="content"`.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import Any

from ..types import TurnEvent


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
