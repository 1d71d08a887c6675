from nesting import depth, flatten


def test_flat_list():
    assert flatten([1, 2, 3]) == [1, 2, 3]


def test_nested_lists():
    assert flatten([1, [2, [3, [4]]], 5]) == [1, 2, 3, 4, 5]


def test_tuples_are_flattened_too():
    assert flatten([1, (2, 3), [(4,), 5]]) == [1, 2, 3, 4, 5]


def test_strings_are_leaves():
    assert flatten(["ab", ["cd", ("ef",)]]) == ["ab", "cd", "ef"]


def test_depth():
    assert depth(7) == 0
    assert depth([]) == 1
    assert depth([1, [2, (3,)]]) == 3
