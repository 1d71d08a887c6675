from search import contains, insert_sorted, lower_bound


def test_lower_bound_middle():
    assert lower_bound([1, 3, 5, 7], 4) == 2
    assert lower_bound([1, 3, 3, 5], 3) == 1


def test_lower_bound_past_the_end():
    assert lower_bound([1, 3, 5], 9) == 3
    assert lower_bound([], 1) == 0


def test_contains():
    assert contains([1, 3, 5], 3)
    assert not contains([1, 3, 5], 4)


def test_insert_largest_goes_last():
    items = [1, 3, 5]
    insert_sorted(items, 9)
    assert items == [1, 3, 5, 9]


def test_insert_keeps_order():
    items = []
    for value in [5, 1, 4, 2, 3, 6]:
        insert_sorted(items, value)
    assert items == [1, 2, 3, 4, 5, 6]
