from textkit import char_histogram, top_words, word_count


def test_word_count():
    """Words are counted, punctuation ignored."""
    assert word_count("Hello, world! Hello again.") == 4


def test_word_count_apostrophes():
    """Contractions count as one word."""
    assert word_count("don't stop") == 2


def test_word_count_empty():
    """Empty text has no words."""
    assert word_count("   ") == 0


def test_top_words_order():
    """Most frequent words come first."""
    assert top_words("b a b c b a", n=2) == [("b", 3), ("a", 2)]


def test_top_words_ties_alphabetical():
    """Ties are broken alphabetically."""
    assert top_words("pear apple fig", n=3) == [("apple", 1), ("fig", 1), ("pear", 1)]


def test_top_words_case_insensitive():
    """Counting ignores case."""
    assert top_words("Cat cat CAT dog", n=1) == [("cat", 3)]


def test_top_words_stopwords():
    """Stopwords are skipped, whatever their case."""
    assert top_words("the cat and the hat", n=2, stopwords=["The", "and"]) == [("cat", 1), ("hat", 1)]


def test_top_words_default_n():
    """By default the top three words are returned."""
    assert len(top_words("a b c d e f")) == 3


def test_char_histogram_letters():
    """Letters are counted case-insensitively."""
    assert char_histogram("Aab!") == {"a": 2, "b": 1}


def test_char_histogram_all_characters():
    """With letters_only=False digits and punctuation count too, spaces never."""
    assert char_histogram("a1 1!", letters_only=False) == {"a": 1, "1": 2, "!": 1}
