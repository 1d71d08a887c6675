"""Render the weekly report as aligned text."""

from __future__ import annotations

from .stats import mean, median, percent_change


def format_percent(value: float) -> str:
    """Signed percentage with one decimal, rounded half away from zero: '+12.5%', '-0.3%', '+0.0%'."""
    return f"{'+' if value >= 0 else '-'}{int(abs(value) * 10) / 10:.1f}%"


def render(metric: str, last_week: list[float], this_week: list[float]) -> str:
    """One line: name, median and mean of this week, and the change of the mean against last week."""
    change = percent_change(mean(last_week), mean(this_week))
    return f"{metric:<12} median={median(this_week):.2f} mean={mean(this_week):.2f} change={format_percent(change)}"
