"""The commands and code of the documentation, found where a reader sees them.

Sources: fenced blocks of ``README.md`` and ``docs/*.md``, and the literal blocks (after ``::``) of the
examples' module docstrings. A marker just before a block says how it is checked; it is invisible once
rendered (an HTML comment in Markdown, a reST comment in a docstring):

- none: the block runs as written, in a fresh temporary directory outside the repository;
- ``doc-test: repo``: it runs as written from the repository root (the docs say to run it there);
- ``doc-test: session``: the blocks so marked in one file run in order in one shell (a walkthrough whose
  later commands use what earlier ones started or set), in a fresh temporary directory;
- ``doc-test: skip: REASON``: not run, because it needs what CI lacks (a GPU, another host, minutes of
  training); the reason is required.

Inline code spans that start with ``agentrl `` are checked against the CLI: the command and every flag
they name must exist.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELL = ("bash", "sh", "console", "shell")
_MARK_MD = re.compile(r"^<!--\s*doc-test:\s*(.*?)\s*-->$")
_MARK_RST = re.compile(r"^\.\.\s+doc-test:\s*(.*)$")
_FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    """One block of documentation code."""

    source: Path
    line: int
    lang: str
    text: str
    mark: str = ""
    """``""``, ``repo``, ``session`` or ``skip: REASON``."""

    @property
    def id(self) -> str:
        return f"{self.source.relative_to(ROOT)}:{self.line}"

    @property
    def skip_reason(self) -> str | None:
        if not self.mark.startswith("skip"):
            return None
        return self.mark.partition(":")[2].strip()


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def example_files() -> list[Path]:
    return sorted(p for p in (ROOT / "examples").glob("*.py") if p.name != "__init__.py")


def markdown_blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        prev = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        mark = _MARK_MD.match(prev)
        out.append(Block(path, start + 1, m.group(1), "\n".join(body) + "\n", mark.group(1) if mark else ""))
    return out


def docstring_blocks(path: Path) -> list[Block]:
    """Literal blocks (the indented lines after a paragraph ending in ``::``) of the module docstring."""
    tree = ast.parse(path.read_text())
    doc = ast.get_docstring(tree, clean=True) or ""
    first = tree.body[0].lineno if tree.body else 1
    lines = doc.splitlines()
    out: list[Block] = []
    mark = ""
    i = 0
    while i < len(lines):
        text = lines[i].strip()
        if m := _MARK_RST.match(text):
            mark = m.group(1).strip()
        if text.endswith("::"):
            i += 1
            while i < len(lines) and not lines[i].strip():
                i += 1
            start = i
            body: list[str] = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
                body.append(lines[i])
                i += 1
            code = "\n".join(x[4:] if x.startswith("    ") else x for x in body).strip() + "\n"
            out.append(Block(path, first + start, "bash", code, mark))
            mark = ""
            continue
        i += 1
    return out


def all_blocks() -> list[Block]:
    blocks = [b for p in doc_files() for b in markdown_blocks(p)]
    return blocks + [b for p in example_files() for b in docstring_blocks(p)]


def agentrl_spans(line: str) -> list[str]:
    """The inline code spans of one line of Markdown that start with ``agentrl ``."""
    return re.findall(r"`(agentrl [^`]+)`", line)


def inline_commands(path: Path) -> list[tuple[int, str]]:
    """``(line, command)`` for each inline code span that starts with ``agentrl ``, outside fenced blocks; a
    span wrapped over two lines counts (its words joined by one space), at the line it starts on."""
    lines = path.read_text().splitlines()
    fenced = False
    prose = []
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
            prose.append("")
            continue
        prose.append("" if fenced else line)
    text = "\n".join(prose)
    out: list[tuple[int, str]] = []
    for m in re.finditer(r"`(agentrl [^`]+)`", text):
        if "\n\n" not in m.group(1):  # a span never crosses a paragraph
            out.append((text.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split())))
    return out
