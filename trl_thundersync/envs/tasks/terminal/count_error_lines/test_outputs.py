"""Verifier for count_error_lines (run in the workspace; each test is one check)."""

from pathlib import Path

WS = Path.cwd()
EXPECTED_ERRORS = 22
LOG_LINES = 240


def test_output_file_exists():
    assert (WS / "error_count.txt").is_file()


def test_output_is_a_single_number():
    text = (WS / "error_count.txt").read_text()
    assert text.strip().isdigit() and len(text.strip().splitlines()) == 1


def test_count_is_correct():
    assert int((WS / "error_count.txt").read_text().strip()) == EXPECTED_ERRORS


def test_log_untouched():
    lines = (WS / "app.log").read_text().splitlines()
    assert len(lines) == LOG_LINES and sum(line.split()[1] == "ERROR" for line in lines) == EXPECTED_ERRORS
