import pytest

from iniparse import parse_ini


def test_sections_exist():
    parsed = parse_ini("[a]\n[b]\n")
    assert set(parsed) == {"", "a", "b"}


def test_comment_lines_skipped():
    assert parse_ini("; hello\n# world\n") == {"": {}}


def test_whitespace_around_key_and_value():
    assert parse_ini("[db]\n  host   =   localhost  \n")["db"] == {"host": "localhost"}


def test_keys_case_insensitive():
    assert parse_ini("[db]\nPort=5432\n")["db"] == {"port": "5432"}


def test_inline_comments_removed():
    parsed = parse_ini("[net]\ntimeout = 30 ; seconds\nproxy = http://p:8080 # corporate\n")
    assert parsed["net"] == {"timeout": "30", "proxy": "http://p:8080"}


def test_hash_inside_value_kept():
    assert parse_ini("color=#ff0000\n")[""] == {"color": "#ff0000"}


def test_bad_line():
    with pytest.raises(ValueError):
        parse_ini("[s]\njust words\n")
