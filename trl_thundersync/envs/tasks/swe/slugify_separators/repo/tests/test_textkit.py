from textkit import slugify


def test_simple_words():
    assert slugify("hello") == "hello"


def test_single_space():
    assert slugify("Hello World") == "hello-world"


def test_repeated_separators_collapse():
    assert slugify("Hello,   World!!") == "hello-world"


def test_no_leading_or_trailing_separator():
    assert slugify("  -- Release notes 2.0 --  ") == "release-notes-2-0"


def test_custom_separator():
    assert slugify("a  b", separator="_") == "a_b"
