"""A minimal INI reader: [sections], key = value lines, full-line and inline comments."""

from __future__ import annotations


def parse_ini(text: str) -> dict[str, dict[str, str]]:
    """Parse INI text into {section: {key: value}}.

    Keys before the first section go to the "" section. Lines starting with ';' or '#' are comments, and so is
    anything after ' ;' or ' #' on a value line. Keys are case-insensitive (stored lowercase); whitespace around
    keys and values is ignored.
    """
    result: dict[str, dict[str, str]] = {"": {}}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith((";", "#")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            result.setdefault(section, {})
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"not a key = value line: {raw!r}")
        result[section][key] = value
    return result
