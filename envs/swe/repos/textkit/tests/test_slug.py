from textkit import slugify


def test_basic():
    """A title becomes lower-case words joined by dashes."""
    assert slugify("Hello World") == "hello-world"


def test_collapses_separators():
    """Runs of spaces, dots and underscores collapse into one dash."""
    assert slugify("a  b__c..d") == "a-b-c-d"


def test_strips_leading_and_trailing():
    """Separators at the ends do not leave dashes behind."""
    assert slugify("  -Hello-  ") == "hello"


def test_drops_punctuation():
    """Punctuation other than separators is removed."""
    assert slugify("What's new?!") == "whats-new"


def test_accents_are_transliterated():
    """Accented letters are turned into plain ASCII."""
    assert slugify("Crème Brûlée") == "creme-brulee"


def test_custom_separator():
    """The separator can be changed."""
    assert slugify("Hello big World", sep="_") == "hello_big_world"


def test_max_length_cuts_at_word_boundary():
    """A long slug is cut at a word boundary, never in the middle of a word."""
    assert slugify("the quick brown fox", max_length=12) == "the-quick"


def test_max_length_exact_fit():
    """A slug that fits exactly is not shortened."""
    assert slugify("the quick brown", max_length=15) == "the-quick-brown"


def test_max_length_boundary_right_after_limit():
    """When the next character after the limit is a separator, the whole prefix is kept."""
    assert slugify("abc def ghi", max_length=7) == "abc-def"


def test_max_length_single_long_word():
    """A single word longer than the limit is cut hard."""
    assert slugify("abcdefghij", max_length=4) == "abcd"


def test_empty():
    """An empty title gives an empty slug."""
    assert slugify("") == ""
