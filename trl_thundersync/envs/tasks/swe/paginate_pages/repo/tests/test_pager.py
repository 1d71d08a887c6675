import pytest

from pager import page_count, paginate

ITEMS = list(range(1, 24))  # 23 items


def test_first_page():
    assert paginate(ITEMS, 1, 10) == list(range(1, 11))


def test_last_partial_page():
    assert paginate(ITEMS, 3, 10) == [21, 22, 23]


def test_past_the_end_is_empty():
    assert paginate(ITEMS, 9, 10) == []


def test_page_count_rounds_up():
    assert page_count(23, 10) == 3
    assert page_count(20, 10) == 2


def test_page_count_empty_is_one():
    assert page_count(0, 10) == 1


def test_invalid_page():
    with pytest.raises(ValueError):
        paginate(ITEMS, 0, 10)
