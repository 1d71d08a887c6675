"""Greedy word wrapping for terminal output."""

from __future__ import annotations


def wrap(text: str, width: int) -> list[str]:
    """Break text into lines of at most `width` characters, breaking only at spaces.

    A single word longer than `width` is split into chunks of `width` characters.
    """
    if width < 1:
        raise ValueError("width must be positive")
    lines: list[str] = []
    current = ""
    for word in text.split():
        candidate = f"{current} {word}" if current else word
        if len(candidate) <= width:
            current = candidate
            continue
        if current:
            lines.append(current)
        while len(word) > width:
            lines.append(word[:width])
            word = word[width:]
        current = word
    if current:
        lines.append(current)
    return lines
