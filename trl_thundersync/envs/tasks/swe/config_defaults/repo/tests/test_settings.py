from settings import Settings, load_settings


def test_explicit_values():
    s = load_settings({"timeout": "2.5", "retries": "7"})
    assert s.timeout == 2.5 and s.retries == 7


def test_default_timeout_is_documented_value():
    assert Settings().timeout == 30
    assert load_settings({}).timeout == 30


def test_tags_do_not_leak_between_calls():
    first = load_settings({"tags": "a,b"})
    second = load_settings({})
    assert first.tags == ["a", "b"]
    assert second.tags == []


def test_passed_tags_not_mutated():
    base = ["x"]
    s = load_settings({"tags": "y"}, tags=base)
    assert s.tags == ["x", "y"] and base == ["x"]
