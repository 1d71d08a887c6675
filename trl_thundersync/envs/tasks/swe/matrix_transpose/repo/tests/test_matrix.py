import pytest

from matrix import matmul, transpose


def test_square_transpose():
    assert transpose([[1, 2], [3, 4]]) == [[1, 3], [2, 4]]


def test_wide_transpose():
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_tall_transpose():
    assert transpose([[1], [2], [3]]) == [[1, 2, 3]]


def test_square_matmul():
    assert matmul([[1, 2], [3, 4]], [[5, 6], [7, 8]]) == [[19, 22], [43, 50]]


def test_rectangular_matmul():
    assert matmul([[1, 2, 3]], [[1], [2], [3]]) == [[14]]


def test_shape_mismatch():
    with pytest.raises(ValueError):
        matmul([[1, 2]], [[1, 2]])
