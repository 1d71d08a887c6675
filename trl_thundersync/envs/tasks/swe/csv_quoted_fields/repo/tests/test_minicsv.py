from minicsv import split_line


def test_plain_fields():
    assert split_line("a,b,c\n") == ["a", "b", "c"]


def test_empty_fields():
    assert split_line("a,,c") == ["a", "", "c"]


def test_quoted_simple():
    assert split_line('"a",b') == ["a", "b"]


def test_quoted_delimiter():
    assert split_line('1,"Smith, John",NY') == ["1", "Smith, John", "NY"]


def test_escaped_quotes():
    assert split_line('x,"say ""hi""",y') == ["x", 'say "hi"', "y"]


def test_other_delimiter():
    assert split_line('a;"b;c"', delimiter=";") == ["a", "b;c"]
