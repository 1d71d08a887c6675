"""Flatten arbitrarily nested lists and tuples."""

from __future__ import annotations

from collections.abc import Iterable


def flatten(value: Iterable) -> list:
    """All leaves of nested lists/tuples, depth first. Strings and bytes are leaves, not sequences."""
    out = []
    for item in value:
        if isinstance(item, (list, tuple)):
            out.extend(flatten(item))
        else:
            out.append(item)
    return out


def depth(value) -> int:
    """Nesting depth: a leaf is 0, [] is 1, [[1]] is 2."""
    if not isinstance(value, (list, tuple)):
        return 0
    return 1 + max((depth(item) for item in value), default=0)
