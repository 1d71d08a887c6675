"""Word frequencies for the search-suggestion index."""

from __future__ import annotations

import string
from collections import Counter


def count_words(text: str) -> Counter:
    """Case-insensitive counts of words; punctuation around words is ignored ("Hello," counts as "hello")."""
    words = (word.strip(string.punctuation).lower() for word in text.split())
    return Counter(word for word in words if word)


def top_words(text: str, n: int) -> list[tuple[str, int]]:
    """The n most frequent words; ties are broken alphabetically."""
    return sorted(count_words(text).items(), key=lambda item: (-item[1], item[0]))[:n]
