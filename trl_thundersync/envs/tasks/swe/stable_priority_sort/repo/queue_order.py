"""Ordering of support tickets for the on-call queue."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Ticket:
    ident: str
    priority: int  # 1 = most urgent


def order_tickets(tickets: list[Ticket]) -> list[Ticket]:
    """Most urgent first; tickets of equal priority keep their arrival order."""
    result = list(tickets)
    for i in range(len(result)):
        best = i
        for j in range(i + 1, len(result)):
            if result[j].priority < result[best].priority:
                best = j
        result[i], result[best] = result[best], result[i]
    return result
