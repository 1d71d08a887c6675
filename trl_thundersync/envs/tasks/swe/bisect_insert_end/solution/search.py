"""Binary search on sorted lists."""

from __future__ import annotations


def lower_bound(items: list, target) -> int:
    """First index i with items[i] >= target (len(items) when every item is smaller)."""
    lo, hi = 0, len(items)
    while lo < hi:
        mid = (lo + hi) // 2
        if items[mid] < target:
            lo = mid + 1
        else:
            hi = mid
    return lo


def contains(items: list, target) -> bool:
    index = lower_bound(items, target)
    return index < len(items) and items[index] == target


def insert_sorted(items: list, value) -> None:
    """Insert `value` keeping `items` sorted."""
    items.insert(lower_bound(items, value), value)
