import datetime as dt

from calendar_utils import parse_date, week_label, week_start


def test_parse_date():
    assert parse_date("2024-02-29") == dt.date(2024, 2, 29)


def test_week_start_is_monday():
    assert week_start(dt.date(2024, 5, 16)) == dt.date(2024, 5, 13)


def test_mid_year_label():
    assert week_label(dt.date(2024, 5, 16)) == "2024-W20"


def test_early_january_belongs_to_previous_year():
    assert week_label(dt.date(2021, 1, 3)) == "2020-W53"


def test_late_december_belongs_to_next_year():
    assert week_label(dt.date(2024, 12, 30)) == "2025-W01"
