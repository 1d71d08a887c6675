from wordfreq import count_words, top_words


def test_plain_counts():
    assert count_words("a b a")["a"] == 2


def test_case_insensitive():
    assert count_words("The the THE")["the"] == 3


def test_punctuation_ignored():
    counts = count_words("Hello, world! Hello... (world)")
    assert counts == {"hello": 2, "world": 2}


def test_top_words_ties_alphabetical():
    text = "pear apple pear apple fig fig kiwi"
    assert top_words(text, 3) == [("apple", 2), ("fig", 2), ("pear", 2)]


def test_top_words_limit():
    assert len(top_words("a b c d", 2)) == 2
