"""No function or method of ``agentrl`` (nor of ``envs`` or ``sandbox``) is 100 lines or longer, counted from its
``def`` line to its last line (decorators excluded): a function that long does several jobs; split it into
well-named pieces with one job each."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("agentrl", "envs", "sandbox")
SKIP = ("envs/swe/repos/",)  # the SWE tasks' sample repositories: task data
MAX_LINES = 100
"""A function of this many lines or more fails."""


def long_functions(path: Path, name: str, limit: int = MAX_LINES) -> list[str]:
    """``name:line function (N lines)`` for each function or method (nested ones included) in ``path`` of
    ``limit`` lines or more, in line order; N is ``end_lineno - lineno + 1`` (``lineno`` is the ``def`` line)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            if n >= limit:
                found.append((node.lineno, f"{name}:{node.lineno} {node.name} ({n} lines)"))
    return [text for _, text in sorted(found)]


def source_files() -> list[tuple[Path, str]]:
    """(path, path relative to the repository) of every .py file under ``SOURCES``, less ``SKIP``."""
    out = []
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not rel.startswith(SKIP):
                out.append((path, rel))
    return out


def test_no_function_is_100_lines_or_longer() -> None:
    files = source_files()
    assert any(rel == "agentrl/http/server/app.py" for _, rel in files), "the walk found none of agentrl's files"
    long = [f for path, rel in files for f in long_functions(path, rel)]
    assert not long, (f"{len(long)} function(s) of {MAX_LINES} lines or more; split each into pieces with one "
                      "job each:\n  " + "\n  ".join(long))


def test_the_check_sees_long_functions_and_methods(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(98))
    source = (
        "import functools\n\n\n"
        f"@functools.cache\ndef long() -> None:\n{body}    return None\n\n\n"  # def, 98 lines, return: 100
        # three decorators and 99 lines: decorators do not count
        f"@functools.cache\n@functools.cache\n@functools.cache\ndef short() -> None:\n{body}\n\n"
        f"class Box:\n    async def run(self) -> None:\n{body.replace('    ', '        ')}        return None\n"
    )
    path = tmp_path / "sample.py"
    path.write_text(source)
    lines = source.splitlines()
    at = {name: lines.index(line) + 1 for name, line in (("long", "def long() -> None:"),
                                                          ("run", "    async def run(self) -> None:"))}
    assert long_functions(path, "sample.py") == [f"sample.py:{at['long']} long (100 lines)",
                                                 f"sample.py:{at['run']} run (100 lines)"]
    assert long_functions(path, "sample.py", limit=101) == []
    assert len(long_functions(path, "sample.py", limit=99)) == 3  # ``short`` is 99 lines
