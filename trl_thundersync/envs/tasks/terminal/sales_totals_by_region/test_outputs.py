"""Verifier for sales_totals_by_region."""

from pathlib import Path

WS = Path.cwd()
EXPECTED = [
    ("central", "5520.87"), ("east", "6010.60"), ("north", "7949.00"), ("south", "6271.57"), ("west", "6615.87"),
]


def rows():
    return [line.split(",") for line in (WS / "totals.csv").read_text().strip().splitlines()]


def test_header():
    assert rows()[0] == ["region", "total"]


def test_one_line_per_region_sorted():
    assert [r[0] for r in rows()[1:]] == [region for region, _ in EXPECTED]


def test_totals_two_decimals():
    assert [tuple(r) for r in rows()[1:]] == EXPECTED
