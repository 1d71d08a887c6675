import pytest

from units import c_to_f, describe, f_to_c


def test_c_to_f():
    assert c_to_f(100) == 212
    assert c_to_f(-40) == -40


def test_f_to_c():
    assert f_to_c(212) == pytest.approx(100)
    assert f_to_c(32) == pytest.approx(0)


def test_round_trip():
    for c in (-30.5, 0, 21.5, 37):
        assert f_to_c(c_to_f(c)) == pytest.approx(c)


def test_describe():
    assert describe(21.5) == "21.5°C / 70.7°F"
