import pytest

from roman import from_roman, to_roman


def test_to_roman():
    assert to_roman(1994) == "MCMXCIV"
    assert to_roman(3888) == "MMMDCCCLXXXVIII"


def test_from_roman_additive():
    assert from_roman("VIII") == 8
    assert from_roman("mdclxvi") == 1666


def test_from_roman_subtractive():
    assert from_roman("IV") == 4
    assert from_roman("XLII") == 42
    assert from_roman("MCMXCIV") == 1994


def test_round_trip():
    for number in range(1, 4000):
        assert from_roman(to_roman(number)) == number


def test_rejects_garbage():
    with pytest.raises(ValueError):
        from_roman("ABC")
