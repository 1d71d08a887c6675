from wrapping import wrap


def test_short_text_one_line():
    assert wrap("hello world", 40) == ["hello world"]


def test_breaks_between_words():
    assert wrap("aaa bbb ccc", 8) == ["aaa bbb", "ccc"]


def test_line_exactly_width_is_kept():
    assert wrap("aaa bbb ccc", 7) == ["aaa bbb", "ccc"]


def test_long_word_is_split():
    assert wrap("xx abcdefghij yy", 4) == ["xx", "abcd", "efgh", "ij", "yy"]


def test_all_lines_within_width():
    text = "the quick brown fox jumps over the lazy dog " * 5
    for width in range(3, 30):
        assert all(len(line) <= width for line in wrap(text, width))
