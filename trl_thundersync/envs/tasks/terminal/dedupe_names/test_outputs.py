"""Verifier for dedupe_names."""

from pathlib import Path

WS = Path.cwd()


def test_duplicates_removed_in_order():
    assert (WS / "names.txt").read_text() == "alice\nbob\ncarol\ndave\neve\nCarol\nfrank\ngrace\n"


def test_removed_count():
    assert (WS / "removed.txt").read_text().strip() == "5"
