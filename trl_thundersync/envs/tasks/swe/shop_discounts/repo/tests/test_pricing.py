import pytest

from shop.inventory import Inventory, OutOfStock
from shop.pricing import discounted, order_total


def stocked():
    inv = Inventory()
    inv.add("pen", 10)
    inv.add("ink", 2)
    return inv


def test_no_discount():
    assert discounted(1999, 0) == 1999


def test_percent_discount():
    assert discounted(2000, 15) == 1700
    assert discounted(999, 50) == 500  # 499.5 rounds up


def test_order_total_without_discount():
    assert order_total([("pen", 150, 4)], stocked()) == 600


def test_order_total_with_discount():
    assert order_total([("pen", 150, 4), ("ink", 999, 1)], stocked(), percent=10) == 4 * 135 + 899


def test_unfillable_order_changes_nothing():
    inv = stocked()
    with pytest.raises(OutOfStock):
        order_total([("pen", 150, 4), ("ink", 999, 3)], inv)
    assert inv.level("pen") == 10 and inv.level("ink") == 2
