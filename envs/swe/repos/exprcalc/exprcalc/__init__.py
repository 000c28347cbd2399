"""exprcalc: evaluate small arithmetic expressions."""

from exprcalc.api import calculate, compile_expr, variables
from exprcalc.errors import CalcError, EvalError, ParseError
from exprcalc.lexer import tokenize

__all__ = ["CalcError", "EvalError", "ParseError", "calculate", "compile_expr", "tokenize", "variables"]
