"""Git object ids computed in Python: the id of the single commit an agent's repository starts from.

The environment creates that commit inside the sandbox with ``git commit`` under a fixed identity and
date; the task's ``base_commit`` is the same id computed here, so a mismatch means the repository
sources changed since the task file was generated.
"""

from __future__ import annotations

import hashlib

BASE_IDENTITY = ("agentrl", "agentrl@localhost")
"""Author and committer of the base commit."""
BASE_DATE = 946684800
"""Date of the base commit (2000-01-01T00:00:00Z)."""
BASE_MESSAGE = "Initial commit"
"""Message of the base commit."""


def _obj(kind: str, body: bytes) -> bytes:
    return hashlib.sha1(f"{kind} {len(body)}\0".encode() + body).digest()


def blob_id(data: bytes) -> str:
    """The id of a blob holding ``data`` (what ``git hash-object`` prints)."""
    return _obj("blob", data).hex()


def _tree(files: dict[str, bytes]) -> bytes:
    entries: dict[str, tuple[bytes, bytes]] = {}
    subdirs: dict[str, dict[str, bytes]] = {}
    for path, data in files.items():
        head, sep, rest = path.partition("/")
        if sep:
            subdirs.setdefault(head, {})[rest] = data
        else:
            entries[head] = (b"100644", _obj("blob", data))
    for name, sub in subdirs.items():
        entries[name] = (b"40000", _tree(sub))
    # git sorts tree entries by name, directories as if their name ended with "/"
    order = sorted(entries, key=lambda n: n.encode() + (b"/" if entries[n][0] == b"40000" else b""))
    body = b"".join(entries[n][0] + b" " + n.encode() + b"\0" + entries[n][1] for n in order)
    return _obj("tree", body)


def tree_id(files: dict[str, bytes]) -> str:
    """The id of the tree of ``files`` (relative path -> content; every file mode 100644)."""
    return _tree(files).hex()


def commit_id(files: dict[str, bytes], *, message: str = BASE_MESSAGE, date: int = BASE_DATE,
              identity: tuple[str, str] = BASE_IDENTITY) -> str:
    """The id of a root commit of ``files`` made by ``identity`` at ``date`` (UTC) with ``message``."""
    who = f"{identity[0]} <{identity[1]}> {date} +0000"
    body = f"tree {tree_id(files)}\nauthor {who}\ncommitter {who}\n\n{message}\n".encode()
    return _obj("commit", body).hex()


def commit_env(date: int = BASE_DATE, identity: tuple[str, str] = BASE_IDENTITY) -> dict[str, str]:
    """Environment variables that make ``git commit`` produce :func:`commit_id`'s commit."""
    stamp = f"{date} +0000"
    return {
        "GIT_AUTHOR_NAME": identity[0], "GIT_AUTHOR_EMAIL": identity[1], "GIT_AUTHOR_DATE": stamp,
        "GIT_COMMITTER_NAME": identity[0], "GIT_COMMITTER_EMAIL": identity[1], "GIT_COMMITTER_DATE": stamp,
        "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
    }
