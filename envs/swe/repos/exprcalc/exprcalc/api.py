"""The public entry points."""

from exprcalc.evaluator import evaluate
from exprcalc.nodes import Binary, Call, Unary, Var
from exprcalc.parser import parse


def _clean(value):
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def calculate(expr, **env):
    """Evaluate ``expr`` with the given variables; whole numbers come back as ``int``."""
    return _clean(evaluate(parse(expr), env))


def variables(expr):
    """The variable names used in ``expr``, sorted, without duplicates."""
    found = set()

    def walk(node):
        if isinstance(node, Var):
            found.add(node.name)
        elif isinstance(node, Unary):
            walk(node.operand)
        elif isinstance(node, Binary):
            walk(node.left)
            walk(node.right)
        elif isinstance(node, Call):
            for arg in node.args:
                walk(arg)

    walk(parse(expr))
    return sorted(found)


def compile_expr(expr):
    """A function of keyword arguments that evaluates ``expr`` (parsed once)."""
    tree = parse(expr)

    def run(**env):
        return _clean(evaluate(tree, env))

    return run
