import pytest

from shop.inventory import Inventory, OutOfStock


def test_add_and_level():
    inv = Inventory()
    inv.add("apple", 3)
    inv.add("apple", 2)
    assert inv.level("apple") == 5


def test_remove():
    inv = Inventory()
    inv.add("apple", 3)
    inv.remove("apple", 2)
    assert inv.level("apple") == 1


def test_remove_too_many_raises_and_keeps_stock():
    inv = Inventory()
    inv.add("apple", 1)
    with pytest.raises(OutOfStock):
        inv.remove("apple", 2)
    assert inv.level("apple") == 1
