import pytest

from textkit import center, truncate, wrap


def test_wrap_basic():
    """Words are packed greedily into lines of the given width."""
    assert wrap("the quick brown fox jumps", width=10) == ["the quick", "brown fox", "jumps"]


def test_wrap_exact_width():
    """A line may be exactly as long as the width."""
    assert wrap("aaaa bbbbb", width=10) == ["aaaa bbbbb"]


def test_wrap_long_word():
    """A word longer than the width gets a line of its own."""
    assert wrap("a verylongword b", width=5) == ["a", "verylongword", "b"]


def test_wrap_collapses_whitespace():
    """Newlines and runs of spaces count as single spaces."""
    assert wrap("one\n\ntwo   three", width=20) == ["one two three"]


def test_wrap_empty():
    """Empty text gives no lines."""
    assert wrap("", width=5) == []


def test_wrap_rejects_zero_width():
    """A width below one is an error."""
    with pytest.raises(ValueError):
        wrap("abc", width=0)


def test_truncate_short_text_unchanged():
    """Text within the limit is returned as is."""
    assert truncate("hello", 5) == "hello"


def test_truncate_adds_ellipsis():
    """Cut text ends with the ellipsis and respects the limit."""
    assert truncate("hello world", 8) == "hello..."


def test_truncate_custom_ellipsis():
    """The ellipsis can be changed."""
    assert truncate("hello world", 6, ellipsis="~") == "hello~"


def test_truncate_limit_too_small():
    """A limit shorter than the ellipsis is an error."""
    with pytest.raises(ValueError):
        truncate("hello", 2)


def test_center_even():
    """Even padding is split equally."""
    assert center("ab", 6) == "  ab  "


def test_center_odd_goes_right():
    """An odd leftover column goes to the right."""
    assert center("ab", 5, fill="*") == "*ab**"


def test_center_too_wide_text():
    """Text wider than the width is returned unchanged."""
    assert center("abcdef", 3) == "abcdef"
