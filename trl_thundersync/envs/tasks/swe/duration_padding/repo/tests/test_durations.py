import pytest

from durations import format_duration


def test_seconds_only():
    assert format_duration(7) == "7s"
    assert format_duration(0) == "0s"


def test_minutes_pad_seconds():
    assert format_duration(245) == "4m 05s"


def test_hours_pad_minutes_and_seconds():
    assert format_duration(3723) == "1h 02m 03s"
    assert format_duration(36000) == "10h 00m 00s"


def test_round_minutes():
    assert format_duration(600) == "10m 00s"


def test_negative():
    with pytest.raises(ValueError):
        format_duration(-1)
