import pytest

from versions import compare, latest


def test_equal():
    assert compare("1.2.3", "1.2.3") == 0


def test_simple_order():
    assert compare("1.2.3", "1.2.4") == -1
    assert compare("2.0.0", "1.9.9") == 1


def test_numeric_not_lexicographic():
    assert compare("1.10.0", "1.9.0") == 1
    assert latest(["0.9.0", "0.10.0", "0.2.0"]) == "0.10.0"


def test_prerelease_before_release():
    assert compare("1.0.0-rc1", "1.0.0") == -1
    assert latest(["1.0.0-rc2", "1.0.0", "1.0.0-beta"]) == "1.0.0"


def test_prerelease_order():
    assert compare("1.0.0-alpha", "1.0.0-beta") == -1


def test_bad_version():
    with pytest.raises(ValueError):
        compare("1.2", "1.2.0")
