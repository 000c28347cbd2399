import pytest

from exprcalc import ParseError, tokenize


def kinds(src):
    return [(t.kind, t.text) for t in tokenize(src)]


def test_numbers_and_operators():
    """Numbers and operators become separate tokens."""
    assert kinds("1+2.5") == [("num", "1"), ("op", "+"), ("num", "2.5"), ("end", "")]


def test_two_character_operators():
    """Two-character operators are not split in two."""
    assert [t.text for t in tokenize("a**b//c<=d")][:-1] == ["a", "**", "b", "//", "c", "<=", "d"]


def test_names_with_underscores_and_digits():
    """Names may contain underscores and digits."""
    assert kinds("rate_2") == [("name", "rate_2"), ("end", "")]


def test_positions():
    """Each token records where it starts."""
    assert [t.pos for t in tokenize("  x + 10")] == [2, 4, 6, 8]


def test_leading_dot_number():
    """A number may start with a decimal point."""
    assert kinds(".5") == [("num", ".5"), ("end", "")]


def test_two_dots_rejected():
    """A number with two decimal points is an error."""
    with pytest.raises(ParseError):
        tokenize("1.2.3")


def test_unknown_character():
    """Unknown characters are reported with their position."""
    with pytest.raises(ParseError) as info:
        tokenize("1 + $")
    assert info.value.position == 4
