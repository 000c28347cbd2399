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


def listens_on(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` holds a socket listening on TCP ``port`` (any address, IPv4 or IPv6, in the
    process's own network namespace); None where this host cannot tell (no ``/proc``, or ``pid``'s
    descriptors are not readable)."""
    inodes = set()
    for table in (f"/proc/{pid}/net/tcp", f"/proc/{pid}/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:  # sl local_address rem_address st ... inode: "0100007F:1F90 ... 0A ..."
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{f[9]}]")
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False


def close_server_sockets() -> int:
    """Close every server-side TCP socket (IPv4 or IPv6) this process holds: bound to a port, or listening,
    and not connected; the count closed. For a process forked from a server: its copy of the server's socket
    (bound before the fork, listening once the server starts serving) would keep the port taken, accepting
    nothing, for as long as it lives, also after the server died. Only this process's descriptors close: the
    server's own socket stays open."""
    import errno
    import socket

    closed = 0
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=fd)
        except OSError:  # the directory's own descriptor, or one closed meanwhile
            continue
        server = False
        if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
            try:
                sock.getpeername()
            except OSError as e:
                server = e.errno == errno.ENOTCONN and sock.getsockname()[1] != 0
        if server:
            sock.close()
            closed += 1
        else:
            sock.detach()
    return closed
