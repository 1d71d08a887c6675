"""Dotted-path lookups into parsed JSON documents: 'servers[1].ports[0]'."""

from __future__ import annotations

from typing import Any

_MISSING = object()


def get_path(document: Any, path: str, default: Any = _MISSING) -> Any:
    """Follow `path` (keys separated by '.', list indices in brackets) into `document`.

    Raises KeyError for a missing key or index unless `default` is given.
    """
    current = document
    for key in path.split("."):
        try:
            current = current[key]
        except (KeyError, IndexError, TypeError):
            if default is _MISSING:
                raise KeyError(path) from None
            return default
    return current
