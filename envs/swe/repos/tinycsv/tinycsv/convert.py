"""Guess the type of a CSV value."""

_TRUE = {"true", "yes"}
_FALSE = {"false", "no"}
_NULL = {"", "null", "none", "na"}


def convert(text):
    """``"3"`` -> 3, ``"2.5"`` -> 2.5, ``"yes"`` -> True, ``""`` -> None; other text is stripped."""
    value = text.strip()
    lower = value.lower()
    if lower in _NULL:
        return None
    if lower in _TRUE:
        return True
    if lower in _FALSE:
        return False
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        return value
