"""Errors raised by exprcalc."""


class CalcError(Exception):
    """Base class of exprcalc errors."""


class ParseError(CalcError):
    """The expression is not well formed."""

    def __init__(self, message, position):
        super().__init__(f"{message} at position {position}")
        self.position = position


class EvalError(CalcError):
    """The expression is well formed but cannot be evaluated."""
