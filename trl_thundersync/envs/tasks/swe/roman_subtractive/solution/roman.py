"""Roman numerals for 1..3999."""

_VALUES = [
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
    (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
]
_SYMBOLS = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def to_roman(number: int) -> str:
    if not 0 < number < 4000:
        raise ValueError(f"{number} is out of range 1..3999")
    parts = []
    for value, symbol in _VALUES:
        count, number = divmod(number, value)
        parts.append(symbol * count)
    return "".join(parts)


def from_roman(text: str) -> int:
    """Parse a numeral such as 'MCMXCIV'."""
    if not text or any(ch not in _SYMBOLS for ch in text.upper()):
        raise ValueError(f"not a roman numeral: {text!r}")
    values = [_SYMBOLS[ch] for ch in text.upper()]
    total = 0
    for index, value in enumerate(values):
        following = values[index + 1] if index + 1 < len(values) else 0
        total += -value if value < following else value
    return total
