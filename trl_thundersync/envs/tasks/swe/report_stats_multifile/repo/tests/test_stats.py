import pytest

from report.stats import mean, median, percent_change


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_median_odd():
    assert median([5, 1, 3]) == 3


def test_median_even():
    assert median([4, 1, 3, 2]) == 2.5


def test_percent_change():
    assert percent_change(200, 250) == 25.0


def test_empty():
    with pytest.raises(ValueError):
        median([])
