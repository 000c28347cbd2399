"""Recursive-descent parser.

Grammar, loosest binding first::

    comparison := sum (("<" | "<=" | ">" | ">=" | "==" | "!=") sum)?
    sum        := product (("+" | "-") product)*
    product    := unary (("*" | "/" | "//" | "%") unary)*
    unary      := "-" unary | power
    power      := atom ("**" unary)?          (right associative)
    atom       := NUMBER | NAME | NAME "(" args ")" | "(" comparison ")"
"""

from exprcalc.errors import ParseError
from exprcalc.lexer import tokenize
from exprcalc.nodes import Binary, Call, Num, Unary, Var

COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")


class Parser:
    def __init__(self, tokens):
        self.tokens = tokens
        self.i = 0

    @property
    def tok(self):
        return self.tokens[self.i]

    def take(self, text=None):
        tok = self.tok
        if text is not None and tok.text != text:
            raise ParseError(f"expected {text!r}, found {tok.text or 'end of input'!r}", tok.pos)
        self.i += 1
        return tok

    def parse(self):
        node = self.comparison()
        if self.tok.kind != "end":
            raise ParseError(f"unexpected {self.tok.text!r}", self.tok.pos)
        return node

    def comparison(self):
        left = self.sum()
        if self.tok.kind == "op" and self.tok.text in COMPARISONS:
            op = self.take().text
            left = Binary(op, left, self.sum())
        return left

    def sum(self):
        node = self.product()
        while self.tok.kind == "op" and self.tok.text in ("+", "-"):
            op = self.take().text
            node = Binary(op, node, self.product())
        return node

    def product(self):
        node = self.unary()
        while self.tok.kind == "op" and self.tok.text in ("*", "/", "//", "%"):
            op = self.take().text
            node = Binary(op, node, self.unary())
        return node

    def unary(self):
        if self.tok.kind == "op" and self.tok.text == "-":
            self.take()
            return Unary("-", self.unary())
        return self.power()

    def power(self):
        base = self.atom()
        if self.tok.kind == "op" and self.tok.text == "**":
            self.take()
            return Binary("**", base, self.unary())
        return base

    def atom(self):
        tok = self.tok
        if tok.kind == "num":
            self.take()
            return Num(float(tok.text))
        if tok.kind == "name":
            self.take()
            if self.tok.text == "(":
                return Call(tok.text, self.arguments())
            return Var(tok.text)
        if tok.text == "(":
            self.take()
            node = self.comparison()
            self.take(")")
            return node
        raise ParseError(f"unexpected {tok.text or 'end of input'!r}", tok.pos)

    def arguments(self):
        self.take("(")
        args = []
        if self.tok.text != ")":
            args.append(self.comparison())
            while self.tok.text == ",":
                self.take()
                args.append(self.comparison())
        self.take(")")
        return tuple(args)


def parse(src):
    """The syntax tree of ``src``."""
    return Parser(tokenize(src)).parse()
