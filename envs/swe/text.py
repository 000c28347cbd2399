"""Pure text helpers of the SWE tools: bounded observations and numbered file views."""

from __future__ import annotations

from agentrl.core.errors import EnvError


class TextViewError(EnvError, ValueError):
    """A view of a text cannot be made as asked: a line range that does not fit the file (the message is
    meant for the model), a length limit that is not positive."""

    code = "env.swe.text_view"


def truncate_middle(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its head and tail with a marker between
    them saying how many characters were left out (the result stays within ``limit`` + the marker)."""
    if limit <= 0:
        raise TextViewError("limit must be positive")
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    dropped = len(text) - head - tail
    return f"{text[:head]}\n[... {dropped} characters omitted ...]\n{text[len(text) - tail:]}"


def numbered(lines: list[str], first: int) -> str:
    """``lines`` (without line endings) prefixed with right-aligned 1-based line numbers and a tab."""
    width = max(len(str(first + len(lines) - 1)), 4)
    return "\n".join(f"{n:>{width}}\t{line}" for n, line in enumerate(lines, start=first))


def view_range(content: str, start_line: int, end_line: int | None, max_lines: int) -> tuple[str, int, int]:
    """Numbered lines ``start_line``..``end_line`` (1-based, inclusive; ``None``/-1: to the end) of
    ``content``, at most ``max_lines`` of them: ``(text, first, last)``. Raises TextViewError (a ValueError)
    for a range that does not fit the file, with a message meant for the model."""
    lines = content.splitlines()
    total = len(lines)
    if end_line == -1:
        end_line = None
    if start_line < 1:
        raise TextViewError(f"start_line must be >= 1 (got {start_line})")
    if total == 0:
        raise TextViewError("the file is empty")
    if start_line > total:
        raise TextViewError(f"start_line {start_line} is past the end of the file ({total} lines)")
    last = total if end_line is None else end_line
    if last < start_line:
        raise TextViewError(f"end_line {end_line} is before start_line {start_line}")
    last = min(last, total, start_line + max_lines - 1)
    return numbered(lines[start_line - 1 : last], start_line), start_line, last


def exec_observation(output: str, exit_code: int, timed_out: bool, timeout_s: float, limit: int) -> str:
    """What the model sees after a shell command: its (bounded) output and how it ended."""
    body = truncate_middle(output, limit) if output else ""
    if timed_out:
        status = f"[timed out after {timeout_s:g}s; the command's processes were killed]"
    else:
        status = f"[exit code {exit_code}]"
    return f"{body.rstrip()}\n{status}" if body.strip() else status
