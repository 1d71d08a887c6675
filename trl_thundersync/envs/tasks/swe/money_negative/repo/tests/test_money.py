from money import format_cents, parse_amount


def test_positive():
    assert format_cents(1234) == "$12.34"
    assert format_cents(100000) == "$1,000.00"
    assert format_cents(0) == "$0.00"


def test_negative():
    assert format_cents(-5) == "-$0.05"
    assert format_cents(-123456) == "-$1,234.56"


def test_currency_symbol():
    assert format_cents(-250, currency="EUR ") == "-EUR 2.50"


def test_parse():
    assert parse_amount("$1,234.50") == 123450
    assert parse_amount("-$0.05") == -5


def test_round_trip():
    for cents in (-100001, -99, -1, 0, 1, 99, 100, 987654321):
        assert parse_amount(format_cents(cents)) == cents
