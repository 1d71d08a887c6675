"""Verifier for merge_env_files."""

from pathlib import Path

WS = Path.cwd()
EXPECTED = [
    "APP_NAME=shop",
    "APP_PORT=9000",
    "DB_URL=postgres://db:5432/shop?sslmode=disable",
    "LOG_LEVEL=debug",
    "FEATURE_X=off",
    "SECRET_KEY=abc=def==",
    "CACHE_DIR=/tmp/cache",
]


def lines():
    return (WS / ".env").read_text().split("\n")


def test_env_file_exists_and_ends_with_newline():
    assert (WS / ".env").read_text().endswith("\n")


def test_no_comments_blanks_or_exports():
    body = lines()[:-1]
    assert body and all(line and not line.startswith(("#", "export ")) for line in body)


def test_overrides_applied():
    values = dict(line.split("=", 1) for line in lines() if line)
    assert values.get("APP_PORT") == "9000" and values.get("LOG_LEVEL") == "debug"


def test_values_with_equals_kept():
    assert "SECRET_KEY=abc=def==" in lines()


def test_exact_order():
    assert lines() == EXPECTED + [""]
