"""Order totals. Prices are integer cents; discounts are whole percentages."""

from __future__ import annotations

from .inventory import Inventory


def discounted(price_cents: int, percent: int) -> int:
    """Price after a percentage discount, rounded to the nearest cent (halves round up)."""
    if not 0 <= percent <= 100:
        raise ValueError("percent must be within 0..100")
    return price_cents - price_cents * percent


def order_total(lines: list[tuple[str, int, int]], inventory: Inventory, percent: int = 0) -> int:
    """Total for (sku, unit_price_cents, units) lines, taking the units out of stock.

    Either every line is taken out of stock or none is (an order that cannot be filled changes nothing).
    """
    total = 0
    for sku, price, units in lines:
        inventory.remove(sku, units)
        total += discounted(price, percent) * units
    return total
