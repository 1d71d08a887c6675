"""Plain-list matrices (lists of rows)."""

from __future__ import annotations


def shape(m: list[list[float]]) -> tuple[int, int]:
    return (len(m), len(m[0]) if m else 0)


def transpose(m: list[list[float]]) -> list[list[float]]:
    """Rows become columns: shape (r, c) -> (c, r)."""
    n = len(m)
    return [[m[i][j] for i in range(n)] for j in range(n)]


def matmul(a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
    """Matrix product a @ b."""
    if shape(a)[1] != shape(b)[0]:
        raise ValueError(f"cannot multiply {shape(a)} by {shape(b)}")
    cols = transpose(b)
    return [[sum(x * y for x, y in zip(row, col)) for col in cols] for row in a]
