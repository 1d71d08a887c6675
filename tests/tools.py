"""Typed tool functions with Google-style docstrings, shared by the agent-loop tests (TRL turns them into schemas)."""

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
