"""Parse URL query strings without urllib (the embedded target lacks it)."""

from __future__ import annotations

_HEX = "0123456789abcdefABCDEF"


def unquote(text: str) -> str:
    """Decode '+' as a space and %XX escapes as UTF-8 bytes."""
    out = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "%" and i + 2 < len(text) and text[i + 1] in _HEX and text[i + 2] in _HEX:
            out.append(int(text[i + 1:i + 3], 16))
            i += 3
            continue
        out.extend(b" " if ch == "+" else ch.encode("utf-8"))
        i += 1
    return out.decode("utf-8", errors="replace")


def parse_query(query: str) -> dict[str, list[str]]:
    """'a=1&b=x+y&a=2' -> {'a': ['1', '2'], 'b': ['x y']}. A leading '?' is ignored; empty pairs are skipped;
    a key without '=' has the value ''."""
    result: dict[str, list[str]] = {}
    for pair in query.removeprefix("?").split("&"):
        if not pair:
            continue
        key, _, value = pair.partition("=")
        result.setdefault(unquote(key), []).append(unquote(value))
    return result
