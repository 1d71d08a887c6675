import pytest

from jpath import get_path

DOC = {
    "name": "cluster",
    "servers": [
        {"host": "a", "ports": [80, 443]},
        {"host": "b", "ports": [8080]},
    ],
    "meta": {"owner": {"team": "infra"}},
}


def test_nested_keys():
    assert get_path(DOC, "meta.owner.team") == "infra"


def test_missing_key_raises():
    with pytest.raises(KeyError):
        get_path(DOC, "meta.nope")


def test_default():
    assert get_path(DOC, "meta.nope", default=None) is None


def test_list_index():
    assert get_path(DOC, "servers[1].host") == "b"


def test_nested_indices():
    assert get_path(DOC, "servers[0].ports[1]") == 443


def test_index_out_of_range_uses_default():
    assert get_path(DOC, "servers[5].host", default="?") == "?"
