from report.render import format_percent, render


def test_format_percent_exact():
    assert format_percent(12.5) == "+12.5%"
    assert format_percent(0) == "+0.0%"


def test_format_percent_rounds_half_away_from_zero():
    assert format_percent(2.25) == "+2.3%"
    assert format_percent(-0.35) == "-0.4%"
    assert format_percent(7.96) == "+8.0%"


def test_render_line():
    line = render("latency_ms", [100, 100], [120, 90, 110, 130])
    assert line == "latency_ms   median=115.00 mean=112.50 change=+12.5%"
