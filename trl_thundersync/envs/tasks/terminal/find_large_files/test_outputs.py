"""Verifier for find_large_files."""

from pathlib import Path

WS = Path.cwd()
EXPECTED = ["tree/a/b/just_over.dat", "tree/a/big.bin", "tree/with space/huge file.log"]


def listed():
    return [line for line in (WS / "large_files.txt").read_text().splitlines() if line.strip()]


def test_all_large_files_listed():
    assert set(EXPECTED) <= set(listed())


def test_boundary_and_links_excluded():
    assert not {"tree/a/exact10k.bin", "tree/link_to_big", "tree/c/medium.txt"} & set(listed())


def test_exact_sorted_list():
    assert listed() == sorted(EXPECTED)
