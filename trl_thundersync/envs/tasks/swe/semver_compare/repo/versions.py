"""Semantic version ordering: MAJOR.MINOR.PATCH with an optional -prerelease suffix."""

from __future__ import annotations


def parse(version: str) -> tuple:
    """'1.4.2-rc1' -> a key that orders versions correctly."""
    core, _, pre = version.partition("-")
    parts = core.split(".")
    if len(parts) != 3:
        raise ValueError(f"not a MAJOR.MINOR.PATCH version: {version!r}")
    return (parts, pre)


def compare(a: str, b: str) -> int:
    """-1 if a < b, 0 if equal, 1 if a > b."""
    ka, kb = parse(a), parse(b)
    return (ka > kb) - (ka < kb)


def latest(versions: list[str]) -> str:
    """The highest version."""
    return max(versions, key=parse)
