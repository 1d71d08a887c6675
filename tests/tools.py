"""Shared by the agent-loop tests: typed tool functions with Google-style docstrings (TRL turns them into schemas)
and the observation spans of a trajectory's env_mask."""

from __future__ import annotations


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: first
        b: second
    """
    return a + b


def echo(text: str) -> str:
    """Echo a text.

    Args:
        text: what to return
    """
    return text


def observation_spans(traj) -> list[tuple[int, int]]:
    """[start, end) of every run of environment tokens (env_mask 0) in a trajectory's completion."""
    spans, start = [], None
    for i, m in enumerate(traj.env_mask + [1]):
        if m == 0 and start is None:
            start = i
        if m == 1 and start is not None:
            spans.append((start, i))
            start = None
    return spans
