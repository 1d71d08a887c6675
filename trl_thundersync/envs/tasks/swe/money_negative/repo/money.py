"""Formatting integer amounts of cents for invoices."""


def format_cents(cents: int, currency: str = "$") -> str:
    """1234 -> '$12.34', -5 -> '-$0.05', 100000 -> '$1,000.00'."""
    units, rest = divmod(cents, 100)
    return f"{currency}{units:,}.{rest:02d}"


def parse_amount(text: str) -> int:
    """'$1,234.50' -> 123450 and '-$0.05' -> -5 (the inverse of format_cents)."""
    sign = -1 if text.startswith("-") else 1
    digits = text.lstrip("-").lstrip("$").replace(",", "")
    units, _, rest = digits.partition(".")
    return sign * (int(units) * 100 + int((rest + "00")[:2]))
