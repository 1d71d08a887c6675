"""Verifier for active_user_emails."""

import json
from pathlib import Path

WS = Path.cwd()
EXPECTED_EMAILS = [
    "ana@example.com", "gus@example.com", "hana@mail.test", "lee@corp.example", "max@example.com", "nia@mail.test",
    "oli@corp.example", "pia@example.com",
]


def test_active_emails():
    assert (WS / "active_emails.txt").read_text().split("\n") == EXPECTED_EMAILS + [""]


def test_summary_counts():
    summary = json.loads((WS / "summary.json").read_text())
    assert summary["active"] == 9 and summary["inactive"] == 9


def test_summary_domains():
    summary = json.loads((WS / "summary.json").read_text())
    assert summary["domains"] == {"example.com": 4, "mail.test": 2, "corp.example": 2}
