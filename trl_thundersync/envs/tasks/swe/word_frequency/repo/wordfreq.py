"""Word frequencies for the search-suggestion index."""

from __future__ import annotations

from collections import Counter


def count_words(text: str) -> Counter:
    """Case-insensitive counts of words; punctuation around words is ignored ("Hello," counts as "hello")."""
    return Counter(text.split())


def top_words(text: str, n: int) -> list[tuple[str, int]]:
    """The n most frequent words; ties are broken alphabetically."""
    return count_words(text).most_common(n)
