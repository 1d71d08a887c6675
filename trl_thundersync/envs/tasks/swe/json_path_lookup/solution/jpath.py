"""Dotted-path lookups into parsed JSON documents: 'servers[1].ports[0]'."""

from __future__ import annotations

import re
from typing import Any

_MISSING = object()
_STEP = re.compile(r"([^.\[\]]+)|\[(-?\d+)\]")


def _steps(path: str) -> list[str | int]:
    steps: list[str | int] = []
    for key, index in _STEP.findall(path):
        steps.append(int(index) if index else key)
    return steps


def get_path(document: Any, path: str, default: Any = _MISSING) -> Any:
    """Follow `path` (keys separated by '.', list indices in brackets) into `document`.

    Raises KeyError for a missing key or index unless `default` is given.
    """
    current = document
    for step in _steps(path):
        try:
            if isinstance(step, int) and not isinstance(current, list):
                raise TypeError
            current = current[step]
        except (KeyError, IndexError, TypeError):
            if default is _MISSING:
                raise KeyError(path) from None
            return default
    return current
