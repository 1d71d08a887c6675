"""Stock levels per SKU."""

from __future__ import annotations


class OutOfStock(Exception):
    """Raised when more units are requested than are in stock."""


class Inventory:
    def __init__(self) -> None:
        self._stock: dict[str, int] = {}

    def add(self, sku: str, units: int) -> None:
        if units <= 0:
            raise ValueError("units must be positive")
        self._stock[sku] = self._stock.get(sku, 0) + units

    def remove(self, sku: str, units: int) -> None:
        """Take units out of stock; raises OutOfStock (and changes nothing) if there are not enough."""
        if units <= 0:
            raise ValueError("units must be positive")
        self._stock[sku] = self._stock.get(sku, 0) - units

    def level(self, sku: str) -> int:
        return self._stock.get(sku, 0)
