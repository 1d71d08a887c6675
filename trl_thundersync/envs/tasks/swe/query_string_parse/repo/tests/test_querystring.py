from querystring import parse_query, unquote


def test_simple():
    assert parse_query("a=1&b=2") == {"a": ["1"], "b": ["2"]}


def test_plus_is_space():
    assert parse_query("q=hello+world") == {"q": ["hello world"]}


def test_repeated_keys_collect_values():
    assert parse_query("a=1&b=x&a=2") == {"a": ["1", "2"], "b": ["x"]}


def test_leading_question_mark_and_empty_pairs():
    assert parse_query("?a=1&&b=") == {"a": ["1"], "b": [""]}


def test_percent_escapes_utf8():
    assert unquote("caf%C3%A9%20bar") == "café bar"
    assert parse_query("path=%2Fhome%2Fme") == {"path": ["/home/me"]}


def test_invalid_escape_kept():
    assert unquote("100%") == "100%"
    assert unquote("%zz") == "%zz"
