"""Temperature conversions for the weather widget."""


def c_to_f(celsius: float) -> float:
    return celsius * 9 / 5 + 32


def f_to_c(fahrenheit: float) -> float:
    return (fahrenheit - 32) * 5 / 9


def describe(celsius: float) -> str:
    """'21.5°C / 70.7°F' with one decimal."""
    return f"{celsius:.1f}°C / {c_to_f(celsius):.1f}°F"
