"""Reading the process table in tests, independently of the code under test."""

from __future__ import annotations

from pathlib import Path


def _fields(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> str | None:
    """The start time of ``pid`` if it is alive (not a zombie), else None: compare it to tell a recycled pid."""
    f = _fields(pid)
    return f[19] if f is not None and f[0] not in ("Z", "X") else None


def descendants(pid: int) -> set[int]:
    """Every live process whose chain of parents reaches ``pid`` (``pid`` excluded)."""
    parent = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (f := _fields(int(entry.name))) is not None:
            parent[int(entry.name)] = int(f[1])
    out: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        for child in [c for c, pp in parent.items() if pp == p and c not in out]:
            out.add(child)
            todo.append(child)
    return out


def command_line(pid: int) -> str:
    """``pid`` and the start of its command line, for messages."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return f"{pid} (gone)"
    text = raw.replace(b"\0", b" ").decode(errors="replace")
    return f"{pid} {text[:100]}"
