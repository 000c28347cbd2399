"""A safe arithmetic evaluator for the ``calculate`` tool.

Only numeric literals (int or float), ``+ - * / // % **``, unary ``+``/``-`` and parentheses are accepted.
The expression is parsed with :func:`ast.parse` and walked by hand: nothing is ever passed to ``eval``,
``exec`` or ``compile``. Hard limits keep every call cheap, whatever the input:

- at most ``MAX_CHARS`` characters, ``MAX_NODES`` AST nodes and ``MAX_DEPTH`` levels of nesting;
- ``|exponent| <= MAX_EXPONENT``, and the size of a power is estimated (with logarithms) *before* it is
  computed, so ``9**9**9`` fails at once instead of hanging;
- every literal, intermediate value and the result must satisfy ``|x| <= MAX_MAGNITUDE``;
- division or modulo by zero is an error.

Whole-number results are returned as ``int``.
"""

from __future__ import annotations

import ast
import math
import operator
import threading
from collections.abc import Callable

from agentrl.core.errors import EnvError

MAX_CHARS = 200
MAX_NODES = 100
MAX_DEPTH = 32
MAX_EXPONENT = 64
MAX_MAGNITUDE = 1e15

Number = int | float


_PARSE_LOCK = threading.Lock()
"""``ast.parse`` one thread at a time: the tool runs in worker threads, and on CPython 3.11 the AST
constructor keeps one recursion counter for all threads ("AST constructor recursion depth mismatch")."""


class CalcError(EnvError, ValueError):
    """The expression is not allowed or cannot be evaluated; the message is meant for the model."""

    code = "env.calc.expression"


_BINOPS: dict[type[ast.operator], tuple[str, Callable[[Number, Number], Number]]] = {
    ast.Add: ("+", operator.add),
    ast.Sub: ("-", operator.sub),
    ast.Mult: ("*", operator.mul),
    ast.Div: ("/", operator.truediv),
    ast.FloorDiv: ("//", operator.floordiv),
    ast.Mod: ("%", operator.mod),
    ast.Pow: ("**", operator.pow),
}
_ALLOWED_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, *_BINOPS, ast.UAdd, ast.USub)


def _check_structure(tree: ast.AST) -> None:
    """Reject disallowed node types and trees that are too large or too deep (iteratively)."""
    count = 0
    stack: list[tuple[ast.AST, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise CalcError(f"expression too complex (more than {MAX_NODES} parts)")
        if depth > MAX_DEPTH:
            raise CalcError(f"expression nested too deeply (more than {MAX_DEPTH} levels)")
        if not isinstance(node, _ALLOWED_NODES):
            raise CalcError(f"unsupported syntax: {type(node).__name__}; use numbers and + - * / // % ** ( )")
        if isinstance(node, ast.Constant) and (
            isinstance(node.value, bool) or not isinstance(node.value, (int, float))
        ):
            raise CalcError(f"unsupported literal {node.value!r}; only int and float numbers are allowed")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def _check_magnitude(value: Number) -> Number:
    if isinstance(value, float) and not math.isfinite(value):
        raise CalcError("result is not a finite number")
    if abs(value) > MAX_MAGNITUDE:
        raise CalcError(f"number too large (limit {MAX_MAGNITUDE:.0e})")
    return value


def _power(base: Number, exponent: Number) -> Number:
    if abs(exponent) > MAX_EXPONENT:
        raise CalcError(f"exponent too large (limit {MAX_EXPONENT})")
    if base == 0 and exponent < 0:
        raise CalcError("division by zero (zero to a negative power)")
    if base < 0 and not float(exponent).is_integer():
        raise CalcError("negative number to a fractional power is not a real number")
    if base != 0 and exponent * math.log10(abs(base)) > math.log10(MAX_MAGNITUDE) + 1:
        raise CalcError(f"number too large (limit {MAX_MAGNITUDE:.0e})")
    if isinstance(base, int) and isinstance(exponent, int) and exponent < 0:
        return float(base) ** exponent
    return base**exponent


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        return _check_magnitude(node.value)
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else +value
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left), _eval(node.right)
        symbol, fn = _BINOPS[type(node.op)]
        if symbol in ("/", "//", "%") and right == 0:
            raise CalcError("division by zero")
        if symbol == "**":
            return _check_magnitude(_power(left, right))
        try:
            return _check_magnitude(fn(left, right))
        except (OverflowError, ZeroDivisionError) as e:
            raise CalcError(f"cannot compute: {e}") from e
    raise CalcError(f"unsupported syntax: {type(node).__name__}")  # pragma: no cover (filtered earlier)


def safe_eval(expression: str) -> int | float:
    """Evaluate an arithmetic expression safely; raise `CalcError` with a short message if it is not allowed.

    >>> safe_eval("23 + 3 * 12")
    59
    >>> safe_eval("7 / 2")
    3.5
    """
    if not isinstance(expression, str):
        raise CalcError("expression must be a string")
    if len(expression) > MAX_CHARS:
        raise CalcError(f"expression too long ({len(expression)} characters, limit {MAX_CHARS})")
    if not expression.strip():
        raise CalcError("empty expression")
    try:
        with _PARSE_LOCK:
            tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise CalcError(f"invalid expression: {getattr(e, 'msg', None) or e}") from None
    _check_structure(tree)
    try:
        value = _eval(tree)
    except RecursionError:  # pragma: no cover (depth is bounded)
        raise CalcError("expression nested too deeply") from None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def format_number(value: int | float) -> str:
    """Render a result for the model: integers plainly, floats rounded to 10 decimals."""
    if isinstance(value, int):
        return str(value)
    return repr(round(value, 10))
