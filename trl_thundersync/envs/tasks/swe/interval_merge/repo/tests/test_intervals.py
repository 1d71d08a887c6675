import pytest

from intervals import merge, total_length


def test_disjoint_sorted():
    assert merge([(1, 2), (5, 6)]) == [(1, 2), (5, 6)]


def test_overlapping():
    assert merge([(1, 4), (2, 6)]) == [(1, 6)]


def test_touching_intervals_merge():
    assert merge([(1, 3), (3, 5)]) == [(1, 5)]


def test_unsorted_input():
    assert merge([(8, 9), (1, 3), (2, 4)]) == [(1, 4), (8, 9)]


def test_total_length():
    assert total_length([(10, 12), (1, 3), (3, 4)]) == 7


def test_bad_interval():
    with pytest.raises(ValueError):
        merge([(3, 1)])
