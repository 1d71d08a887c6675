"""Calendar helpers for the weekly report."""

from __future__ import annotations

import datetime as dt


def parse_date(text: str) -> dt.date:
    """Parse 'YYYY-MM-DD'."""
    year, month, day = (int(part) for part in text.split("-"))
    return dt.date(year, month, day)


def week_label(day: dt.date) -> str:
    """ISO 8601 week label, e.g. '2021-W01'. Weeks start on Monday; week 1 contains the year's first Thursday."""
    iso_year, iso_week, _ = day.isocalendar()
    return f"{iso_year}-W{iso_week:02d}"


def week_start(day: dt.date) -> dt.date:
    """The Monday of the ISO week containing `day`."""
    return day - dt.timedelta(days=day.weekday())
