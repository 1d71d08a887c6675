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


def take_ready(inbox: queue.Queue, first: Any, done: Any) -> list:
    """`first` and every item already waiting in `inbox` behind it, up to and including `done`, without blocking."""
    items = [first]
    while items[-1] is not done:
        try:
            items.append(inbox.get_nowait())
        except queue.Empty:
            break
    return items


def coalesce_turns(items: list) -> list:
    """`items` with each trajectory's consecutive turns among them merged into one `CoalescedTurns`, at the place of
    the first (nothing of that trajectory lies between them: its content and reward come after its last turn)."""
    out: list = []
    at: dict[int, int] = {}  # trajectory -> position in `out` of its open run of turns
    for item in items:
        if isinstance(item, TurnEvent):
            slot = at.get(item.index)
            if slot is not None and out[slot][-1].turn + 1 == item.turn:
                out[slot].append(item)
                continue
            at[item.index] = len(out)
            out.append([item])
        else:
            if isinstance(item, BaseException):  # a producer's failure: nothing moves ahead of it
                at.clear()
            out.append(item)
    return [(x[0] if len(x) == 1 else CoalescedTurns(tuple(x))) if isinstance(x, list) else x for x in out]
