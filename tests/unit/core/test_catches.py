"""An ``except`` clause names the agentrl error it means: no ``except ValueError`` (or any other builtin) that
is there to catch an agentrl error which only happens to subclass that builtin.

The check reads each ``try`` statement of agentrl, ``agentrl.envs`` and ``agentrl.sandbox`` (and each
``with contextlib.suppress(...)``) and collects what its body raises on purpose: the agentrl errors raised in
the body itself, and those raised in the body of each agentrl function or class it calls by a name that
resolves (``f(...)``, ``module.f(...)``, ``Class.method(...)``, ``Class(...)``, ``self.method(...)``, or a
function handed to ``asyncio.to_thread``). It goes one level deep: not into what those functions call, nor into
the methods of other objects. A clause that catches one of these errors only through a builtin base fails the
check: name the agentrl class (or its area base) in the clause, beside the builtin when a library's error is
meant too (``except (SettingError, json.JSONDecodeError)``), or in an earlier clause of the same ``try``.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from agentrl.core.errors import AgentRLError

ROOT = Path(__file__).resolve().parents[3]
TREES = {"agentrl": ROOT / "agentrl", "agentrl.envs": ROOT / "envs", "agentrl.sandbox": ROOT / "sandbox"}
SKIP = (
    "agentrl/tools/scaffold/example_env_check",  # a template for users to copy, not a module of agentrl
    "envs/swe/repos/",  # the SWE tasks' sample repositories: task data, not agentrl code
)
BUILTIN = {v for v in vars(builtins).values() if isinstance(v, type) and issubclass(v, BaseException)} - {
    Exception, BaseException}

Scope = dict[str, Any]
"""What the names of a piece of code refer to: a module's globals, then the imports of the enclosing functions."""


def _modules() -> Iterator[tuple[Path, ModuleType]]:
    """Each source file of the three trees, with its imported module (one whose optional dependency is missing
    here is left out)."""
    for package, tree in TREES.items():
        for path in sorted(tree.rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(SKIP):
                continue
            parts = path.relative_to(tree).with_suffix("").parts
            name = ".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))
            try:
                yield path, importlib.import_module(name)
            except ImportError as e:
                if (getattr(e, "name", None) or "").split(".")[0] == "agentrl":
                    raise
                continue


@functools.cache
def _tree(filename: str) -> ast.Module:
    return ast.parse(Path(filename).read_text(), filename)


def _local_imports(fn: ast.AST) -> Scope:
    """``from module import name`` statements inside ``fn`` (agentrl imports heavy modules late), resolved."""
    scope: Scope = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("agentrl"):
            try:
                module = importlib.import_module(node.module)
            except ImportError:
                continue
            for alias in node.names:
                if hasattr(module, alias.name):
                    scope[alias.asname or alias.name] = getattr(module, alias.name)
    return scope


def _resolve(node: ast.expr, scope: Scope) -> Any:
    """The object a name or a dotted attribute chain refers to, or None."""
    if isinstance(node, ast.Name):
        return scope.get(node.id, vars(builtins).get(node.id))
    if isinstance(node, ast.Attribute):
        owner = _resolve(node.value, scope)
        if isinstance(owner, (ModuleType, type)):
            return inspect.getattr_static(owner, node.attr, None) if isinstance(owner, type) else getattr(
                owner, node.attr, None)
    return None


def _is_agentrl_error(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, AgentRLError)


def _handled(exc: type, handlers: list[list[Any]]) -> bool:
    return any(isinstance(t, type) and issubclass(exc, t) for types in handlers for t in types)


def _escaping(body: list[ast.stmt], scope: Scope, calls: bool = True) -> dict[type, str]:
    """The agentrl errors that leave ``body`` on purpose, each with where it comes from: raised by its ``raise``
    statements, and (``calls``) by the agentrl functions it calls (:func:`_callee_raises`); not those that a
    ``try`` inside ``body`` catches, nor anything in the functions, lambdas and classes it defines (they run
    later)."""
    out: dict[type, str] = {}
    todo: list[ast.AST] = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Try):  # what its clauses catch stays inside; the rest goes on
            caught = [_types(h.type, scope) for h in node.handlers]
            for exc, where in _escaping(node.body, scope, calls).items():
                if not _handled(exc, caught):
                    out.setdefault(exc, where)
            todo.extend([*node.handlers, *node.orelse, *node.finalbody])
            continue
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = _resolve(node.exc.func if isinstance(node.exc, ast.Call) else node.exc, scope)
            if _is_agentrl_error(exc):
                out.setdefault(exc, "raised in the try body")
        elif calls and isinstance(node, ast.Call):
            # a function handed to a worker thread (asyncio.to_thread, loop.run_in_executor) runs as if called here
            handed = node.args if ast.unparse(node.func).endswith(("to_thread", "run_in_executor")) else []
            for func in (node.func, *handed):
                for exc in _callee_raises(func, scope):
                    out.setdefault(exc, f"raised by {ast.unparse(func)}()")
        todo.extend(ast.iter_child_nodes(node))
    return out


@functools.cache
def _raises_of(fn: Any) -> frozenset[type]:
    """The agentrl errors that the agentrl function ``fn`` raises in its own body (see :func:`_escaping`)."""
    fn = inspect.unwrap(fn)
    code = getattr(fn, "__code__", None)
    if code is None or not (getattr(fn, "__module__", "") or "").startswith("agentrl") or not Path(
            code.co_filename).is_file():  # a dataclass's generated __init__ has no file
        return frozenset()
    for node in ast.walk(_tree(code.co_filename)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == fn.__name__ and code.co_firstlineno in (
                node.lineno, *(d.lineno for d in node.decorator_list)):
            return frozenset(_escaping(node.body, {**fn.__globals__, **_local_imports(node)}, calls=False))
    return frozenset()


def _callee_raises(func: ast.expr, scope: Scope) -> set[type]:
    """What the agentrl function (or class: its ``__init__``) that ``func`` names raises; nothing when it does not
    name one that resolves."""
    target = _resolve(func, scope)
    if isinstance(target, (classmethod, staticmethod)):
        target = target.__func__
    if isinstance(target, type):
        if issubclass(target, BaseException):
            return set()
        target = inspect.getattr_static(target, "__init__", None)
    return set(_raises_of(target)) if inspect.isfunction(target) else set()


def _types(node: ast.expr | None, scope: Scope) -> list[Any]:
    if node is None:
        return [BaseException]
    return [_resolve(e, scope) for e in (node.elts if isinstance(node, ast.Tuple) else [node])]


Guarded = tuple[ast.AST, str | None, list[ast.stmt], list[tuple[int, ast.expr | None]]]


def _guarded(tree: ast.Module) -> Iterator[Guarded]:
    """Each ``try`` (and ``with contextlib.suppress(...)``) of ``tree``: its function, the name of the top-level
    class whose method it is in (None: none), its body and its clauses (line, what the clause catches)."""
    def visit(node: ast.AST, fn: ast.AST, cls: str | None) -> Iterator[Guarded]:
        for child in ast.iter_child_nodes(node):
            inner = child if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else fn
            owner = child.name if isinstance(child, ast.ClassDef) and node is tree else cls
            if isinstance(child, ast.Try):
                yield inner, owner, child.body, [(h.lineno, h.type) for h in child.handlers]
            elif isinstance(child, (ast.With, ast.AsyncWith)):
                for item in child.items:
                    call = item.context_expr
                    if isinstance(call, ast.Call) and ast.unparse(call.func).endswith("suppress") and call.args:
                        yield inner, owner, child.body, [(child.lineno, ast.Tuple(elts=list(call.args)))]
            yield from visit(child, inner, owner)

    yield from visit(tree, tree, None)


def imprecise_catches() -> list[str]:
    """``file:line``, the builtin and the agentrl error of each clause that catches an agentrl error raised on
    purpose in its ``try`` only through a builtin base."""
    found: list[str] = []
    for path, module in _modules():
        if Path(module.__file__ or "").resolve() != path.resolve():
            continue
        tree = _tree(str(path))
        for fn, cls, body, clauses in _guarded(tree):
            scope = {**vars(module), **_local_imports(fn)}
            if cls is not None and isinstance(vars(module).get(cls), type):  # self.method(), cls(...)
                scope["self"] = scope["cls"] = vars(module)[cls]
            reaching = _escaping(body, scope)
            if not reaching:
                continue
            earlier: list[list[Any]] = []
            for line, node in clauses:
                types = _types(node, scope)
                for exc, where in sorted(reaching.items(), key=lambda kv: kv[0].__name__):
                    if _handled(exc, earlier) or _handled(exc, [[t for t in types if t not in BUILTIN]]):
                        continue
                    via = [t.__name__ for t in types if t in BUILTIN and issubclass(exc, t)]
                    if via:
                        found.append(f"{path.relative_to(ROOT).as_posix()}:{line} catches {exc.__name__} "
                                     f"({where}) as {via[0]}")
                earlier.append(types)
    return found


PENDING: set[str] = set()
"""Clauses known to reach an agentrl error through a builtin, each with its fix named beside it (none today). An
entry that is no longer found fails the test: remove it with the fix."""


def _what(found: str) -> str:
    """``AdapterWriteError as ValueError`` of a finding."""
    error, _, rest = found.partition(" catches ")[2].partition(" (")
    return f"{error} as {rest.rpartition(' as ')[2]}"


def test_each_clause_names_the_agentrl_error_it_catches() -> None:
    found = imprecise_catches()
    open_ = [f for f in found if _what(f) not in PENDING]
    assert not open_, "name the agentrl error in these except clauses (see the module docstring):\n  " + "\n  ".join(open_)
    stale = sorted(PENDING - {_what(f) for f in found})
    assert not stale, f"fixed: remove them from PENDING: {stale}"


SAMPLE = """
from agentrl.config.errors import SettingError
from agentrl.core.errors import ConfigError


def check(x):
    if x < 0:
        raise SettingError("negative")
    return x


def called(x):
    try:
        return check(x)
    {clause}:
        return None


def inline(x):
    try:
        if x < 0:
            raise SettingError("negative")
    {clause}:
        return None


def caught_inside(x):
    try:
        try:
            return check(x)
        except SettingError:  # never reaches the clause below
            return None
    {clause}:
        return None
"""


@pytest.mark.parametrize("clause, flagged", [
    ("except ValueError", True),
    ("except (SettingError, ValueError)", False),
    ("except ConfigError", False),
    ("except TypeError", False),  # does not catch it at all
])
def test_the_check_finds_a_builtin_clause_that_means_an_agentrl_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clause: str, flagged: bool) -> None:
    name = "agentrl_catch_sample_" + "".join(c if c.isalnum() else "_" for c in clause)  # a module per case
    (tmp_path / name).mkdir()
    source = SAMPLE.format(clause=clause)
    (tmp_path / name / "__init__.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys.modules[__name__], "TREES", {name: tmp_path / name})
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = imprecise_catches()
    if flagged:
        lines = [i for i, text in enumerate(source.splitlines(), 1) if text.strip() == f"{clause}:"][:2]
        assert [f.split(" ", 1)[0] for f in found] == [f"{name}/__init__.py:{i}" for i in lines], found
        assert found[0].endswith("catches SettingError (raised by check()) as ValueError"), found
        assert found[1].endswith("catches SettingError (raised in the try body) as ValueError"), found
    else:
        assert found == []
