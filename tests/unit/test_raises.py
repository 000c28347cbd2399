"""Every error agentrl raises on purpose is an ``AgentRLError`` with a code: no ``raise`` of a bare builtin
exception in agentrl, ``agentrl.envs`` or ``agentrl.sandbox``, except where Python's own protocols ask for
one (the short list below). The classes agentrl raises instead keep the builtin as a second base, so
``except ValueError`` code (and pydantic, which turns a validator's ``ValueError`` into a validation error)
works as before."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = (ROOT / "agentrl", ROOT / "envs", ROOT / "sandbox")
SKIP = (
    "agentrl/tools/scaffold/example_env_check",  # a template for users to copy, not a module of agentrl
    "envs/swe/repos/",  # the SWE tasks' sample repositories: task data, not agentrl code
)
BUILTIN = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
EXITS = {"SystemExit", "KeyboardInterrupt", "GeneratorExit"}
# what Python's protocols expect a method of this name to raise
PROTOCOL = {
    "__getattr__": {"AttributeError"},
    "__getitem__": {"KeyError", "IndexError"},
    "__next__": {"StopIteration"},
    "__anext__": {"StopAsyncIteration"},
}


def _is_stub(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """An abstract method: a docstring at most, then ``raise NotImplementedError``."""
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return len(body) == 1 and isinstance(body[0], ast.Raise)


def _raised_name(node: ast.Raise) -> str | None:
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    return exc.id if isinstance(exc, ast.Name) else None


def builtin_raises(path: Path) -> list[str]:
    """``file:line Name`` for each raise of a builtin exception in ``path`` that no protocol asks for."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[str] = []

    def visit(node: ast.AST, fn: ast.FunctionDef | ast.AsyncFunctionDef | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child)
                continue
            if isinstance(child, ast.Raise) and child.exc is not None:
                name = _raised_name(child)
                allowed = EXITS | (PROTOCOL.get(fn.name, set()) if fn else set())
                if fn is not None and name == "NotImplementedError" and _is_stub(fn):
                    allowed = allowed | {name}
                if name in BUILTIN and name not in allowed:
                    found.append(f"{path.relative_to(ROOT)}:{child.lineno} {name}")
            visit(child, fn)

    visit(tree, None)
    return found


def test_no_bare_builtin_raise_outside_the_protocols() -> None:
    files = [p for tree in TREES for p in sorted(tree.rglob("*.py"))
             if not str(p.relative_to(ROOT)).startswith(SKIP)]
    assert len(files) > 100, "the walk found the sources"
    found = [hit for p in files for hit in builtin_raises(p)]
    assert not found, ("raise an agentrl error (an AgentRLError with a code, keeping the builtin as a second "
                       f"base) instead of these {len(found)}:\n" + "\n".join(found))


def test_the_check_sees_a_builtin_raise_and_lets_the_protocols_pass(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "def f(x):\n    raise ValueError(x)\n"
        "def g():\n    raise TimeoutError\n"
        "def __getattr__(name):\n    raise AttributeError(name)\n"
        "class A:\n    def run(self):\n        '''Subclasses run.'''\n        raise NotImplementedError\n"
        "    def half(self):\n        if self:\n            raise NotImplementedError('half done')\n        return 1\n"
        "def h(e):\n    raise e\n"
        "def main():\n    raise SystemExit(2)\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert builtin_raises(src) == ["m.py:2 ValueError", "m.py:4 TimeoutError", "m.py:13 NotImplementedError"]
    finally:
        ROOT = saved
