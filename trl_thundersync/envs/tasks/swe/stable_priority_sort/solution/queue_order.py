"""Ordering of support tickets for the on-call queue."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Ticket:
    ident: str
    priority: int  # 1 = most urgent


def order_tickets(tickets: list[Ticket]) -> list[Ticket]:
    """Most urgent first; tickets of equal priority keep their arrival order."""
    return sorted(tickets, key=lambda ticket: ticket.priority)
