"""Turn an expression into tokens."""

from dataclasses import dataclass

from exprcalc.errors import ParseError

OPERATORS = ["**", "//", "<=", ">=", "==", "!=", "+", "-", "*", "/", "%", "<", ">", "(", ")", ","]


@dataclass(frozen=True)
class Token:
    kind: str
    """"num", "name", "op" or "end"."""
    text: str
    pos: int


def _read_number(src, start):
    i = start
    seen_dot = False
    while i < len(src) and (src[i].isdigit() or src[i] == "."):
        if src[i] == ".":
            if seen_dot:
                raise ParseError("number with two decimal points", i)
            seen_dot = True
        i += 1
    if src[start:i] == ".":
        raise ParseError("lonely decimal point", start)
    return i


def _read_name(src, start):
    i = start
    while i < len(src) and (src[i].isalnum() or src[i] == "_"):
        i += 1
    return i


def tokenize(src):
    """The tokens of ``src``, ending with an ``end`` token."""
    tokens = []
    i = 0
    while i < len(src):
        ch = src[i]
        if ch.isspace():
            i += 1
            continue
        if ch.isdigit() or ch == ".":
            end = _read_number(src, i)
            tokens.append(Token("num", src[i:end], i))
            i = end
            continue
        if ch.isalpha() or ch == "_":
            end = _read_name(src, i)
            tokens.append(Token("name", src[i:end], i))
            i = end
            continue
        for op in OPERATORS:
            if src.startswith(op, i):
                tokens.append(Token("op", op, i))
                i += len(op)
                break
        else:
            raise ParseError(f"unexpected character {ch!r}", i)
    tokens.append(Token("end", "", len(src)))
    return tokens
