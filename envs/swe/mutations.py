"""Procedural bug injection (SWE-smith style): AST-located, text-level mutations of Python source.

Each `Mutation` replaces one span of a file with new text, so the rest of the file keeps its formatting.
`find_mutations` lists every candidate of every kind in a file, in a deterministic order; the task
builder runs the tests on each candidate and keeps the ones that break a few tests.

Kinds: ``off_by_one`` (``<`` vs ``<=``, a dropped ``+ 1``, a constant moved by one), ``wrong_operator``
(``+``/``-``, ``//``/``/``, ``and``/``or``), ``inverted_condition`` (``==``/``!=``, ``in``/``not in``, a negated
``if``), ``swapped_args``, ``wrong_call`` (``min``/``max``, ``lstrip``/``rstrip``, ...), ``removed_line``,
``missing_edge_case`` (a guard clause removed), ``wrong_default`` and ``wrong_variable``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

KINDS = (
    "off_by_one", "wrong_operator", "inverted_condition", "swapped_args", "wrong_call",
    "removed_line", "missing_edge_case", "wrong_default", "wrong_variable",
)  # fmt: skip

_COMPARE_SWAPS = {"<": ("<=", "off_by_one"), "<=": ("<", "off_by_one"), ">": (">=", "off_by_one"),
                  ">=": (">", "off_by_one"), "==": ("!=", "inverted_condition"),
                  "!=": ("==", "inverted_condition"), "in": ("not in", "inverted_condition"),
                  "not in": ("in", "inverted_condition"), "is": ("is not", "inverted_condition"),
                  "is not": ("is", "inverted_condition")}
_BINOP_SWAPS = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.FloorDiv: ("//", "/"), ast.Div: ("/", "//"),
                ast.Mult: ("*", "+")}
_CALL_SWAPS = {"min": "max", "max": "min", "any": "all", "all": "any", "lstrip": "rstrip", "rstrip": "lstrip",
               "startswith": "endswith", "endswith": "startswith", "index": "rindex", "rindex": "index",
               "floor": "ceil", "ceil": "floor", "upper": "lower", "lower": "upper", "popleft": "pop",
               "insert": "append", "capitalize": "title", "isupper": "islower", "islower": "isupper"}
_SKIP_CALLS = {"isinstance", "print", "super", "getattr", "setattr", "hasattr", "range", "ValueError",
               "KeyError", "TypeError"}


@dataclass(frozen=True)
class Mutation:
    """Replace ``source[start:end]`` of ``path`` by ``replacement`` (character offsets)."""

    kind: str
    path: str
    line: int
    start: int
    end: int
    replacement: str
    note: str
    """What changed, for build logs (never shown to the agent)."""

    def apply(self, source: str) -> str:
        return source[: self.start] + self.replacement + source[self.end :]

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.path, self.start, self.end)


class _Source:
    """Offsets and segments of a source text, from AST positions (columns are UTF-8 byte offsets)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = text.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1]
        return self.starts[lineno - 1] + len(line.encode()[:col].decode("utf-8", "replace"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (self.offset(node.lineno, node.col_offset),  # type: ignore[attr-defined]
                self.offset(node.end_lineno, node.end_col_offset))  # type: ignore[attr-defined]

    def seg(self, node: ast.AST) -> str:
        a, b = self.span(node)
        return self.text[a:b]

    def line_span(self, node: ast.stmt) -> tuple[int, int] | None:
        """The whole lines of a statement, if nothing else shares them."""
        a, b = self.span(node)
        first, last = self.starts[node.lineno - 1], self.starts[node.end_lineno]  # type: ignore[index]
        if self.text[first:a].strip() or self.text[b:last].strip():
            return None
        return first, last


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    out = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            out[child] = node
    return out


def _function_of(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> ast.FunctionDef | None:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node  # type: ignore[return-value]
    return None


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _op_in_gap(src: _Source, left: ast.AST, right: ast.AST, op: str) -> tuple[int, int] | None:
    """Where the operator ``op`` is written between two operands (exactly once)."""
    a = src.span(left)[1]
    b = src.span(right)[0]
    gap = src.text[a:b]
    words = op.isalpha() or " " in op
    hits = []
    i = gap.find(op)
    while i >= 0:
        before = gap[i - 1] if i > 0 else " "
        after = gap[i + len(op)] if i + len(op) < len(gap) else " "
        if words and (before.isalnum() or after.isalnum()):
            pass
        elif not words and (before in "<>=!*/" or after in "<>=!*/"):
            pass
        else:
            hits.append(i)
        i = gap.find(op, i + 1)
    if len(hits) != 1:
        return None
    return a + hits[0], a + hits[0] + len(op)


_CMP_TEXT = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
             ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}


def find_mutations(path: str, text: str) -> list[Mutation]:
    """Every candidate mutation of the functions in ``text`` (module-level code is left alone)."""
    src = _Source(text)
    tree = ast.parse(text)
    parents = _parents(tree)
    out: list[Mutation] = []

    def add(kind: str, node: ast.AST, span: tuple[int, int], new: str, note: str) -> None:
        out.append(Mutation(kind, path, node.lineno, span[0], span[1], new, note))  # type: ignore[attr-defined]

    for node in ast.walk(tree):
        fn = _function_of(node, parents)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            _defaults(node, src, add)
            _statements(node, src, add)
            _variables(node, src, add)
            continue
        if fn is None:
            continue
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            op = _CMP_TEXT.get(type(node.ops[0]))
            where = _op_in_gap(src, node.left, node.comparators[0], op) if op else None
            if op and where:
                new, kind = _COMPARE_SWAPS[op]
                add(kind, node, where, new, f"`{op}` -> `{new}`")
        elif isinstance(node, ast.BinOp):
            _binop(node, src, add)
        elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
            op, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
            where = _op_in_gap(src, node.values[0], node.values[1], op)
            if where:
                add("wrong_operator", node, where, new, f"`{op}` -> `{new}`")
        elif isinstance(node, ast.Call):
            _call(node, src, add)
        elif isinstance(node, (ast.If, ast.While)) and not isinstance(node.test, ast.Constant):
            a, b = src.span(node.test)
            if isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not):
                new = src.seg(node.test.operand)
            else:
                new = f"not ({src.seg(node.test)})"
            add("inverted_condition", node, (a, b), new, f"condition `{src.seg(node.test)}` negated")
        elif (isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value <= 12
              and isinstance(parents.get(node), (ast.Compare, ast.Slice, ast.Subscript, ast.BinOp))):
            for new in (node.value + 1, node.value - 1):
                if new >= 0:
                    add("off_by_one", node, src.span(node), str(new), f"constant {node.value} -> {new}")
    return sorted(out, key=lambda m: (m.start, m.end, m.kind, m.replacement))


def _binop(node: ast.BinOp, src: _Source, add) -> None:  # type: ignore[no-untyped-def]
    swap = _BINOP_SWAPS.get(type(node.op))
    if swap is None:
        return
    op, new = swap
    where = _op_in_gap(src, node.left, node.right, op)
    if where:
        add("wrong_operator", node, where, new, f"`{op}` -> `{new}`")
    if isinstance(node.op, (ast.Add, ast.Sub)) and isinstance(node.right, ast.Constant) and node.right.value == 1:
        add("off_by_one", node, src.span(node), src.seg(node.left), f"dropped `{op} 1`")


def _call(node: ast.Call, src: _Source, add) -> None:  # type: ignore[no-untyped-def]
    name = node.func.id if isinstance(node.func, ast.Name) else (
        node.func.attr if isinstance(node.func, ast.Attribute) else None)
    if name is None or name in _SKIP_CALLS:
        return
    args = node.args
    if (len(args) >= 2 and not any(isinstance(a, ast.Starred) for a in args[:2])
            and src.seg(args[0]) != src.seg(args[1])):
        (a0, b0), (a1, b1) = src.span(args[0]), src.span(args[1])
        first, second = src.seg(args[0]), src.seg(args[1])
        between = src.text[b0:a1]
        add("swapped_args", node, (a0, b1), second + between + first, f"arguments of {name}() swapped")
    new = _CALL_SWAPS.get(name)
    if new is not None:
        if isinstance(node.func, ast.Name):
            span = src.span(node.func)
        else:
            end = src.span(node.func)[1]
            span = (end - len(name), end)
        add("wrong_call", node, span, new, f"{name}() -> {new}()")
    for kw in node.keywords:
        if kw.arg == "reverse" and isinstance(kw.value, ast.Name):
            add("wrong_call", node, src.span(kw.value), f"not {kw.value.id}", "reverse flipped")


def _defaults(fn: ast.FunctionDef, src: _Source, add) -> None:  # type: ignore[no-untyped-def]
    for d in [*fn.args.defaults, *(k for k in fn.args.kw_defaults if k is not None)]:
        if isinstance(d, ast.Constant) and type(d.value) is bool:
            add("wrong_default", d, src.span(d), str(not d.value), f"default {d.value} -> {not d.value}")
        elif isinstance(d, ast.Constant) and type(d.value) is int:
            new = d.value + 1 if d.value <= 1 else d.value - 1
            add("wrong_default", d, src.span(d), str(new), f"default {d.value} -> {new}")
        elif isinstance(d, ast.Constant) and isinstance(d.value, str) and len(d.value) == 1:
            new = "_" if d.value != "_" else "-"
            quote = src.seg(d)[0]
            add("wrong_default", d, src.span(d), f"{quote}{new}{quote}", f"default {d.value!r} -> {new!r}")


def _statements(fn: ast.FunctionDef, src: _Source, add) -> None:  # type: ignore[no-untyped-def]
    bodies: list[list[ast.stmt]] = []
    for node in ast.walk(fn):
        for field in ("body", "orelse"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                bodies.append(stmts)
    for stmts in bodies:
        real = [s for s in stmts if not _is_docstring(s)]
        for stmt in real:
            if len(real) < 2:
                break
            span = src.line_span(stmt)
            if span is None:
                continue
            text = src.seg(stmt)
            if isinstance(stmt, (ast.Assign, ast.AugAssign)) or (
                    isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
                add("removed_line", stmt, span, "", f"removed `{text.splitlines()[0]}`")
            elif (isinstance(stmt, ast.If) and not stmt.orelse and len(stmt.body) == 1
                  and isinstance(stmt.body[0], (ast.Return, ast.Raise, ast.Continue, ast.Break))
                  and src.text[src.span(stmt)[0]:].startswith("if ")):
                add("missing_edge_case", stmt, span, "", f"removed guard `{text.splitlines()[0]}`")


def _variables(fn: ast.FunctionDef, src: _Source, add) -> None:  # type: ignore[no-untyped-def]
    """Replace a read of a local variable by another local that is already bound at that line."""
    bound: dict[str, int] = {}
    for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]:
        if a.arg != "self":
            bound[a.arg] = fn.lineno
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.setdefault(node.id, node.lineno)
    for node in ast.walk(fn):
        if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in bound):
            continue
        others = sorted(n for n, line in bound.items() if n != node.id and line < node.lineno)
        for other in others[:3]:
            add("wrong_variable", node, src.span(node), other, f"`{node.id}` -> `{other}`")
