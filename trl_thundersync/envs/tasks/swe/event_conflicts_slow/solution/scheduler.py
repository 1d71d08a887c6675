"""Meeting-room scheduling: find events that overlap."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    name: str
    start: int  # minutes since midnight, inclusive
    end: int  # minutes since midnight, exclusive


def overlaps(a: Event, b: Event) -> bool:
    return a.start < b.end and b.start < a.end


def find_conflicts(events: list[Event]) -> set[tuple[str, str]]:
    """Every pair of overlapping events, as (earlier-starting name, later-starting name) with ties by name."""
    ordered = sorted(events, key=lambda e: (e.start, e.name))
    conflicts = set()
    for i, first in enumerate(ordered):
        for second in ordered[i + 1:]:
            if second.start >= first.end:
                break
            conflicts.add((first.name, second.name))
    return conflicts
