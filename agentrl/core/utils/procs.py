"""Reading this host's process table from /proc: the one parser of ``/proc/<pid>/stat``."""

from __future__ import annotations

import os
from pathlib import Path


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (``[0]`` state, ``[1]`` parent pid,
    ``[2]`` process group, ``[19]`` start time in clock ticks), or None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_table() -> dict[int, tuple[int, int, str]]:
    """Every live (not zombie) process: pid -> (parent pid, process group, start time)."""
    table = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (f := stat_fields(int(entry.name))) is not None and f[0] not in ("Z", "X"):
            table[int(entry.name)] = (int(f[1]), int(f[2]), f[19])
    return table
