from trees import depth, find_path, leaves

TREE = {
    "name": "root",
    "children": [
        {"name": "a", "children": [{"name": "a1"}, {"name": "a2"}]},
        {"name": "b"},
        {"name": "c", "children": [{"name": "c1", "children": [{"name": "c1x"}]}]},
    ],
}


def test_leaves():
    assert leaves(TREE) == ["a1", "a2", "b", "c1x"]


def test_depth_of_single_node():
    assert depth({"name": "solo"}) == 1


def test_depth_of_tree():
    assert depth(TREE) == 4


def test_find_path_first_branch():
    assert find_path(TREE, "a1") == ["root", "a", "a1"]


def test_find_path_later_branch():
    assert find_path(TREE, "c1x") == ["root", "c", "c1", "c1x"]


def test_find_path_missing():
    assert find_path(TREE, "zzz") is None
