import pytest

from exprcalc import EvalError, calculate, compile_expr, variables


def test_integers_come_back_as_int():
    """Whole results are returned as int."""
    result = calculate("7 / 7")
    assert result == 1 and isinstance(result, int)


def test_fraction():
    """Non-integer results stay floats."""
    assert calculate("7 / 2") == 3.5


def test_floor_division_and_modulo():
    """Floor division and modulo follow Python's rules."""
    assert (calculate("-7 // 2"), calculate("-7 % 3")) == (-4, 2)


def test_variables():
    """Variables are taken from keyword arguments."""
    assert calculate("2 * x + y", x=3, y=1) == 7


def test_undefined_variable():
    """An unknown variable is an evaluation error."""
    with pytest.raises(EvalError):
        calculate("x + 1")


def test_division_by_zero():
    """Dividing by zero is an evaluation error, not a crash."""
    with pytest.raises(EvalError):
        calculate("1 / (2 - 2)")


def test_modulo_by_zero():
    """Modulo by zero is an evaluation error too."""
    with pytest.raises(EvalError):
        calculate("5 % 0")


def test_comparisons():
    """Comparisons give 1 for true and 0 for false."""
    assert [calculate(e) for e in ("1 < 2", "2 <= 2", "3 > 4", "4 >= 5", "1 != 1")] == [1, 1, 0, 0, 0]


def test_functions():
    """abs, min and max work with several arguments."""
    assert calculate("max(1, 5, 3) - min(4, 2) + abs(-1)") == 4


def test_min_single_argument():
    """min of one value is that value."""
    assert calculate("min(7)") == 7


def test_round_with_digits():
    """round takes an optional number of digits."""
    assert calculate("round(3.14159, 2)") == 3.14


def test_function_arity():
    """abs takes exactly one argument."""
    with pytest.raises(EvalError):
        calculate("abs(1, 2)")


def test_unknown_function():
    """Unknown functions are reported."""
    with pytest.raises(EvalError):
        calculate("sqrt(4)")


def test_zero_to_negative_power():
    """Zero to a negative power is an evaluation error."""
    with pytest.raises(EvalError):
        calculate("0 ** -1")


def test_variables_listing():
    """variables() lists names once, sorted, including those inside calls."""
    assert variables("b + a * max(c, a)") == ["a", "b", "c"]


def test_compile_expr_reuse():
    """A compiled expression can be evaluated many times."""
    f = compile_expr("x ** 2 - 1")
    assert [f(x=v) for v in (1, 2, 3)] == [0, 3, 8]
