"""Parse URL query strings without urllib (the embedded target lacks it)."""

from __future__ import annotations

_HEX = "0123456789abcdefABCDEF"


def unquote(text: str) -> str:
    """Decode '+' as a space and %XX escapes as UTF-8 bytes."""
    return text.replace("+", " ")


def parse_query(query: str) -> dict[str, list[str]]:
    """'a=1&b=x+y&a=2' -> {'a': ['1', '2'], 'b': ['x y']}. A leading '?' is ignored; empty pairs are skipped;
    a key without '=' has the value ''."""
    result: dict[str, list[str]] = {}
    for pair in query.split("&"):
        key, _, value = pair.partition("=")
        result[unquote(key)] = [unquote(value)]
    return result
