"""Evaluate syntax trees."""

from exprcalc.errors import EvalError
from exprcalc.nodes import Binary, Call, Num, Unary, Var

FUNCTIONS = {
    "abs": (abs, 1, 1),
    "min": (min, 1, None),
    "max": (max, 1, None),
    "round": (round, 1, 2),
}


def _divide(op, a, b):
    if b == 0:
        raise EvalError("division by zero")
    if op == "/":
        return a / b
    if op == "//":
        return a // b
    return a % b


def _binary(op, a, b):
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op in ("/", "//", "%"):
        return _divide(op, a, b)
    if op == "**":
        if a == 0 and b < 0:
            raise EvalError("zero to a negative power")
        return a**b
    if op == "<":
        return float(a < b)
    if op == "<=":
        return float(a <= b)
    if op == ">":
        return float(a > b)
    if op == ">=":
        return float(a >= b)
    if op == "==":
        return float(a == b)
    if op == "!=":
        return float(a != b)
    raise EvalError(f"unknown operator {op}")


def _call(name, args):
    if name not in FUNCTIONS:
        raise EvalError(f"unknown function {name}")
    fn, least, most = FUNCTIONS[name]
    if len(args) < least or (most is not None and len(args) > most):
        raise EvalError(f"{name} takes {least} to {most or 'any number of'} arguments, got {len(args)}")
    if name == "round" and len(args) == 2:
        return fn(args[0], int(args[1]))
    if name in ("min", "max") and len(args) == 1:
        return args[0]
    return fn(*args)


def evaluate(node, env):
    """The value of ``node`` with variables from ``env``."""
    if isinstance(node, Num):
        return node.value
    if isinstance(node, Var):
        if node.name not in env:
            raise EvalError(f"undefined variable {node.name}")
        return env[node.name]
    if isinstance(node, Unary):
        return -evaluate(node.operand, env)
    if isinstance(node, Binary):
        return _binary(node.op, evaluate(node.left, env), evaluate(node.right, env))
    if isinstance(node, Call):
        return _call(node.func, [evaluate(a, env) for a in node.args])
    raise EvalError(f"cannot evaluate {node!r}")
