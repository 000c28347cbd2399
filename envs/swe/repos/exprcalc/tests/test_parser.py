import pytest

from exprcalc import ParseError, calculate


def test_precedence():
    """Multiplication binds tighter than addition."""
    assert calculate("2 + 3 * 4") == 14


def test_left_associative_subtraction():
    """Subtraction groups from the left."""
    assert calculate("10 - 4 - 3") == 3


def test_left_associative_division():
    """Division groups from the left."""
    assert calculate("100 / 10 / 5") == 2


def test_power_right_associative():
    """Powers group from the right."""
    assert calculate("2 ** 3 ** 2") == 512


def test_unary_minus_and_power():
    """Unary minus applies after the power."""
    assert calculate("-2 ** 2") == -4


def test_double_negation():
    """Unary minus can be repeated."""
    assert calculate("--3") == 3


def test_parentheses():
    """Parentheses override precedence."""
    assert calculate("(2 + 3) * 4") == 20


def test_comparison_is_loosest():
    """Comparisons bind looser than arithmetic."""
    assert calculate("1 + 1 == 2") == 1


def test_missing_parenthesis():
    """An unclosed parenthesis is a parse error."""
    with pytest.raises(ParseError):
        calculate("(1 + 2")


def test_trailing_garbage():
    """Extra tokens after a complete expression are an error."""
    with pytest.raises(ParseError):
        calculate("1 2")
