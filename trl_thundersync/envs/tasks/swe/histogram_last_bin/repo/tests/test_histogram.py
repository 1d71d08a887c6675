import pytest

from histogram import bin_edges, histogram


def test_edges():
    assert bin_edges(0, 10, 5) == [0, 2, 4, 6, 8, 10]


def test_interior_values():
    assert histogram([0, 1, 2, 3, 9.5], 0, 10, 5) == [2, 2, 0, 0, 1]


def test_outside_values_ignored():
    assert histogram([-1, 11, 5], 0, 10, 5) == [0, 0, 1, 0, 0]


def test_high_edge_goes_to_last_bin():
    assert histogram([10, 10, 0], 0, 10, 5) == [1, 0, 0, 0, 2]


def test_total_count_for_closed_range():
    values = [i / 10 for i in range(0, 101)]  # 0.0 .. 10.0 inclusive
    assert sum(histogram(values, 0, 10, 4)) == 101


def test_invalid():
    with pytest.raises(ValueError):
        histogram([1], 5, 5, 3)
