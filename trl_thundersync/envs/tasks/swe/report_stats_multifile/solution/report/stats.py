"""Summary statistics over a list of numbers."""

from __future__ import annotations


def mean(values: list[float]) -> float:
    if not values:
        raise ValueError("mean of an empty list")
    return sum(values) / len(values)


def median(values: list[float]) -> float:
    """Middle value; for an even count, the mean of the two middle values."""
    if not values:
        raise ValueError("median of an empty list")
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def percent_change(old: float, new: float) -> float:
    """Change from old to new in percent (old must be non-zero)."""
    if old == 0:
        raise ValueError("percent change from zero is undefined")
    return (new - old) / old * 100
