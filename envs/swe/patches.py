"""Unified diffs, pure Python: split, parse, make, apply (forward or reverse), and turn into edits.

Only exact application is supported (a hunk's old lines must appear verbatim; it may sit at another line
than its header says). This is enough for the bundled tasks, whose patches this module writes, and for
the oracle, which replays a task's ``patch`` as ``edit_file`` calls.
"""

from __future__ import annotations

import difflib
import itertools
import re
from dataclasses import dataclass, field

from agentrl.core.errors import EnvError

_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_NO_NEWLINE = "\\ No newline at end of file"
DEV_NULL = "/dev/null"


class PatchError(EnvError, ValueError):
    """A patch is malformed or does not apply."""

    code = "env.swe.patch"


class TextNotFound(EnvError, LookupError):
    """The text to replace does not occur in the file (``args[0]``: that text)."""

    code = "env.swe.replace.not_found"


class TextNotUnique(EnvError, ValueError):
    """The text to replace is empty, or occurs more than once (then ``args[0]`` lists the lines where it
    starts)."""

    code = "env.swe.replace.not_unique"


@dataclass
class Hunk:
    """One ``@@`` hunk: its lines as ``(tag, text)``, tag in `` ``/``-``/``+``, text with its line ending."""

    old_start: int
    new_start: int
    lines: list[tuple[str, str]] = field(default_factory=list)

    @property
    def old_text(self) -> str:
        """The lines the hunk expects (context and removed)."""
        return "".join(t for tag, t in self.lines if tag != "+")

    @property
    def new_text(self) -> str:
        """The lines the hunk leaves (context and added)."""
        return "".join(t for tag, t in self.lines if tag != "-")


@dataclass
class FilePatch:
    """The changes of one file. ``old_path``/``new_path`` are None for a created/deleted file."""

    old_path: str | None
    new_path: str | None
    hunks: list[Hunk]
    text: str
    """The file's block of the patch, verbatim (header included)."""
    binary: bool = False
    mode_lines: list[str] = field(default_factory=list)
    """Extended header lines such as ``new file mode 100644`` or ``new mode 100755``."""

    @property
    def path(self) -> str:
        """The file's path (the new one, or the old one for a deletion)."""
        return self.new_path or self.old_path or ""

    @property
    def paths(self) -> set[str]:
        """Every path the block touches."""
        return {p for p in (self.old_path, self.new_path) if p}


# ----- parsing ---------------------------------------------------------------------------------------
def _unquote(s: str) -> str:
    """A C-style quoted git path (``"a/t\\303\\251st"``) -> text; unquoted input is returned as is."""
    if not (len(s) >= 2 and s[0] == '"' and s[-1] == '"'):
        return s
    out = bytearray()
    body = s[1:-1]
    i = 0
    simple = {"n": 10, "t": 9, '"': 34, "\\": 92, "a": 7, "b": 8, "f": 12, "r": 13, "v": 11}
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in simple:
                out.append(simple[nxt])
                i += 2
                continue
            if nxt.isdigit() and i + 3 < len(body) + 1:
                out.append(int(body[i + 1 : i + 4], 8) & 0xFF)
                i += 4
                continue
        out.extend(ch.encode())
        i += 1
    return out.decode("utf-8", "replace")


def _strip_prefix(path: str) -> str | None:
    path = _unquote(path.split("\t")[0].rstrip("\n"))
    if path == DEV_NULL:
        return None
    return path[2:] if path[:2] in ("a/", "b/") else path


def _git_header_paths(line: str) -> tuple[str | None, str | None]:
    """Paths of ``diff --git a/X b/Y`` (quoted or not; unquoted X == Y with spaces is handled)."""
    rest = line[len("diff --git ") :].rstrip("\n")
    if rest.startswith('"'):
        end = rest.index('"', 1)
        while rest[end - 1] == "\\":
            end = rest.index('"', end + 1)
        a, b = rest[: end + 1], rest[end + 2 :]
    elif rest.endswith('"'):
        start = rest.rindex(' "')
        a, b = rest[:start], rest[start + 1 :]
    else:
        n = (len(rest) - 1) // 2  # "a/P b/P": both halves equal
        if rest[:n][2:] == rest[n + 1 :][2:]:
            a, b = rest[:n], rest[n + 1 :]
        else:
            a, _, b = rest.partition(" b/")
            b = "b/" + b
    return _strip_prefix(a), _strip_prefix(b)


def split_blocks(text: str) -> list[str]:
    """The per-file blocks of a patch (``diff --git`` headers, or ``---`` headers for a plain diff)."""
    lines = text.splitlines(keepends=True)
    git = any(line.startswith("diff --git ") for line in lines)
    starts = []
    for i, line in enumerate(lines):
        if git and line.startswith("diff --git "):
            starts.append(i)
        elif not git and line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            starts.append(i)
    starts.append(len(lines))
    return ["".join(lines[a:b]) for a, b in itertools.pairwise(starts)]


def _parse_block(block: str) -> FilePatch:
    lines = block.splitlines(keepends=True)
    old_path = new_path = None
    have_git_paths = False
    if lines and lines[0].startswith("diff --git "):
        old_path, new_path = _git_header_paths(lines[0])
        have_git_paths = True
    hunks: list[Hunk] = []
    mode_lines: list[str] = []
    binary = False
    created = deleted = False
    i = 1 if have_git_paths else 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and not hunks and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old_path = _strip_prefix(line[4:])
            new_path = _strip_prefix(lines[i + 1][4:])
            i += 2
            continue
        elif line.startswith("@@"):
            m = _HUNK_RE.match(line)
            if not m:
                raise PatchError(f"bad hunk header: {line.strip()}")
            old_len = int(m.group(2)) if m.group(2) is not None else 1
            new_len = int(m.group(4)) if m.group(4) is not None else 1
            hunk = Hunk(int(m.group(1)), int(m.group(3)))
            i += 1
            seen_old = seen_new = 0
            while i < len(lines) and (seen_old < old_len or seen_new < new_len):
                cur = lines[i]
                if cur.startswith(_NO_NEWLINE):
                    i += 1
                    continue
                tag, body = cur[:1], cur[1:]
                if cur == "\n":  # an empty context line whose leading space was stripped
                    tag, body = " ", "\n"
                if tag not in (" ", "-", "+"):
                    raise PatchError(f"bad line in hunk: {cur!r}")
                if i + 1 < len(lines) and lines[i + 1].startswith(_NO_NEWLINE):
                    body = body[:-1] if body.endswith("\n") else body
                hunk.lines.append((tag, body))
                seen_old += tag != "+"
                seen_new += tag != "-"
                i += 1
            if seen_old != old_len or seen_new != new_len:
                raise PatchError(f"hunk {line.strip()} is truncated")
            if i < len(lines) and lines[i].startswith(_NO_NEWLINE):
                last_tag, last_body = hunk.lines[-1]
                hunk.lines[-1] = (last_tag, last_body[:-1] if last_body.endswith("\n") else last_body)
                i += 1
            hunks.append(hunk)
            continue
        elif line.startswith(("GIT binary patch", "Binary files ")):
            binary = True
        elif line.startswith(("new file mode", "deleted file mode", "old mode", "new mode")):
            mode_lines.append(line.strip())
            created |= line.startswith("new file mode")
            deleted |= line.startswith("deleted file mode")
        i += 1
    if created:
        old_path = None
    if deleted:
        new_path = None
    return FilePatch(old_path, new_path, hunks, block, binary=binary, mode_lines=mode_lines)


def parse_patch(text: str) -> list[FilePatch]:
    """The file patches of ``text`` (raises PatchError when malformed)."""
    return [_parse_block(b) for b in split_blocks(text) if b.strip()]


def touched_paths(text: str) -> set[str]:
    """Every path a patch touches."""
    out: set[str] = set()
    for fp in parse_patch(text):
        out |= fp.paths
    return out


# ----- making ----------------------------------------------------------------------------------------
def _range(start: int, length: int) -> str:
    beginning = start + 1
    if length == 1:
        return f"{beginning}"
    if not length:
        beginning -= 1
    return f"{beginning},{length}"


def _emit(tag: str, line: str) -> list[str]:
    if line.endswith("\n"):
        return [tag + line]
    return [tag + line + "\n", _NO_NEWLINE + "\n"]


def make_file_patch(path: str, old: str | None, new: str | None, context: int = 3) -> str:
    """A git-style diff of one file (``old``/``new`` None: created/deleted); "" when unchanged."""
    if old == new:
        return ""
    a = (old or "").splitlines(keepends=True)
    b = (new or "").splitlines(keepends=True)
    out = [f"diff --git a/{path} b/{path}\n"]
    if old is None:
        out += ["new file mode 100644\n", "--- /dev/null\n", f"+++ b/{path}\n"]
    elif new is None:
        out += ["deleted file mode 100644\n", f"--- a/{path}\n", "+++ /dev/null\n"]
    else:
        out += [f"--- a/{path}\n", f"+++ b/{path}\n"]
    for group in difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(context):
        first, last = group[0], group[-1]
        out.append(f"@@ -{_range(first[1], last[2] - first[1])} +{_range(first[3], last[4] - first[3])} @@\n")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                for line in a[i1:i2]:
                    out += _emit(" ", line)
                continue
            for line in a[i1:i2]:
                out += _emit("-", line)
            for line in b[j1:j2]:
                out += _emit("+", line)
    return "".join(out)


def make_patch(old: dict[str, str], new: dict[str, str], context: int = 3) -> str:
    """A git-style diff turning the files ``old`` into ``new`` (paths sorted)."""
    return "".join(
        make_file_patch(p, old.get(p), new.get(p), context) for p in sorted(set(old) | set(new))
    )


# ----- applying --------------------------------------------------------------------------------------
def _apply_hunks(content: str, hunks: list[Hunk], reverse: bool, path: str) -> str:
    offset_hint = 0
    for hunk in hunks:
        old, new = (hunk.new_text, hunk.old_text) if reverse else (hunk.old_text, hunk.new_text)
        # the header's line number (0 for an insertion at the top), shifted by the earlier hunks
        start_line = max((hunk.new_start if reverse else hunk.old_start) - 1, 0) + offset_hint
        if not old:  # pure insertion (no context): after line `start` of the header
            at = (hunk.new_start if reverse else hunk.old_start) + offset_hint
            lines = content.splitlines(keepends=True)
            content = "".join(lines[:at]) + new + "".join(lines[at:])
            offset_hint += new.count("\n")
            continue
        # prefer the occurrence nearest to where the header says the hunk starts
        hits = [m.start() for m in re.finditer(re.escape(old), content)]
        if not hits:
            raise PatchError(f"{path}: hunk @@ -{hunk.old_start} +{hunk.new_start} does not apply")
        best = min(hits, key=lambda pos: abs(content.count("\n", 0, pos) - start_line))
        content = content[:best] + new + content[best + len(old) :]
        offset_hint += new.count("\n") - old.count("\n")
    return content


def apply_patch(files: dict[str, str], patch: str, *, reverse: bool = False) -> dict[str, str]:
    """``files`` (path -> text) with ``patch`` applied (undone with ``reverse``); a new dict."""
    out = dict(files)
    for fp in parse_patch(patch):
        if fp.binary:
            raise PatchError(f"{fp.path}: binary patches are not supported")
        src, dst = (fp.new_path, fp.old_path) if reverse else (fp.old_path, fp.new_path)
        if src is None:  # creation
            if dst in out:
                raise PatchError(f"{dst}: already exists")
            out[dst] = _apply_hunks("", fp.hunks, reverse, dst)
            continue
        if src not in out:
            raise PatchError(f"{src}: no such file")
        content = _apply_hunks(out.pop(src), fp.hunks, reverse, src)
        if dst is not None:
            out[dst] = content
        elif content:
            raise PatchError(f"{src}: deleted file still has content after the patch")
    return out


# ----- edits (what the oracle sends through edit_file) -----------------------------------------------
@dataclass(frozen=True)
class Edit:
    """One exact string replacement in a file; ``old_str == ""`` creates the file, ``delete`` removes it."""

    path: str
    old_str: str
    new_str: str
    delete: bool = False


def patch_to_edits(patch: str) -> list[Edit]:
    """The ``edit_file`` calls that apply ``patch``: one per hunk, each replacing the hunk's old lines
    (context included) by its new lines; created files become one edit with an empty ``old_str``."""
    edits: list[Edit] = []
    for fp in parse_patch(patch):
        if fp.binary:
            raise PatchError(f"{fp.path}: binary patches cannot become edits")
        if fp.old_path and fp.new_path and fp.old_path != fp.new_path:
            raise PatchError(f"{fp.old_path} -> {fp.new_path}: renames cannot become edits")
        if fp.new_path is None:
            edits.append(Edit(fp.old_path or "", "", "", delete=True))
        elif fp.old_path is None:
            edits.append(Edit(fp.new_path, "", "".join(h.new_text for h in fp.hunks)))
        else:
            edits.extend(Edit(fp.new_path, h.old_text, h.new_text) for h in fp.hunks)
    return edits


def replace_unique(content: str, old: str, new: str) -> tuple[str, int]:
    """``content`` with the single occurrence of ``old`` replaced by ``new``, and the 1-based line where it
    starts. Raises TextNotFound (a LookupError) when ``old`` is missing, TextNotUnique(lines) (a ValueError)
    when it occurs more than once, TextNotUnique when it is empty."""
    if not old:
        raise TextNotUnique("old_str is empty")
    first = content.find(old)
    if first < 0:
        raise TextNotFound(old)
    second = content.find(old, first + 1)
    if second >= 0:
        lines = [content.count("\n", 0, m.start()) + 1 for m in re.finditer(re.escape(old), content)]
        if len(lines) < 2:  # overlapping matches: finditer skips them
            lines = [content.count("\n", 0, first) + 1, content.count("\n", 0, second) + 1]
        raise TextNotUnique(lines)
    return content[:first] + new + content[first + len(old) :], content.count("\n", 0, first) + 1
