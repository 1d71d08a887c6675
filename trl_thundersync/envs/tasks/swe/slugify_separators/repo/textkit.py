"""Small text helpers used to build URL slugs."""

import re


def slugify(title: str, separator: str = "-") -> str:
    """Lowercase `title`, keep letters and digits, join the words with `separator`."""
    words = re.split(r"[^a-z0-9]", title.lower())
    return separator.join(words)
