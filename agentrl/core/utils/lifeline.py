"""Nothing a process starts outlives it: a warden ends its children and containers when it dies, however it dies.

The first time a process (a run's driver, an env server, a benchmark) declares that it owns something, it
starts one *warden*: a small child process, in a session of its own, that blocks reading a pipe whose only
write end the owner holds. Over that pipe the owner declares what it owns:

- a process (:func:`own_process`): the process, every process it starts (found by parent links, so children
  in sessions of their own, such as torchrun's ranks, count) and, when it leads a process group, every member
  of that group (such as a vLLM server's engine core and workers);
- containers (:func:`own_containers`): those carrying a set of labels on a Docker engine.

The warden rereads the process table every ``SCAN_S`` seconds, so it knows each owned tree even after a
parent in it has died. When the owner ends (normally, by an exception, or killed by any signal, SIGKILL
included), the kernel closes the pipe; the warden reads end-of-file, sends SIGTERM to every owned process
that is still the process it saw (same start time: a recycled pid is never touched), SIGKILL to those left
after ``GRACE_S``, removes the owned containers, and exits: everything is gone within about
``GRACE_S + 2`` seconds. A clean stop calls :func:`release_process` first, so a warden never signals what
its owner already stopped.

The pipe's write end is not inherited by programs the owner executes (it is close-on-exec) nor kept by a
forked child (it is closed after ``fork``), so only the owner's own death closes it. The next-start reapers
(``agentrl.inference.server.reap_stale``, ``sandbox.gc``) stay as a second line for a killed warden.

    python -m agentrl.core.utils.lifeline   # the warden itself (started by this module, not by hand)
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from agentrl.core.utils.procs import process_table, stat_fields

SCAN_S = 0.5
"""How often the warden rereads the process table (seconds)."""
GRACE_S = 5.0
"""How long the warden waits after SIGTERM before SIGKILL (seconds)."""

_lock = threading.Lock()
_pipe: Any = None  # the write end of the warden's stdin, in the owner
_warden: subprocess.Popen | None = None
_owner_pid: int | None = None
_containers_sent: set[str] = set()


# --- the process table ------------------------------------------------------------------------------------

def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, process group, start time in clock ticks) of a live, non-zombie process, or None."""
    f = stat_fields(pid)
    if f is None or f[0] in ("Z", "X"):
        return None
    return int(f[1]), int(f[2]), f[19]


def _same(pid: int, start: str) -> bool:
    """Whether ``pid`` is alive and is still the process that started at ``start``."""
    st = _stat(pid)
    return st is not None and st[2] == start


def owned_processes(roots: dict[int, str], table: dict[int, tuple[int, int, str]]) -> dict[int, str]:
    """The processes ``roots`` (pid -> start time) stand for in ``table``: each root that is still the same
    process, its descendants, and, for a root that leads its process group, the group's members (a root in
    its owner's group does not make the owner's group its own). Returns pid -> start time. Pure."""
    live_roots = {pid for pid, start in roots.items() if pid in table and table[pid][2] == start}
    groups = {pid for pid in live_roots if table[pid][1] == pid}
    out = {pid: table[pid][2] for pid in live_roots}
    out.update({pid: st[2] for pid, st in table.items() if st[1] in groups})
    children: dict[int, list[int]] = {}
    for pid, st in table.items():
        children.setdefault(st[0], []).append(pid)
    todo = list(out)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in out:
                out[child] = table[child][2]
                todo.append(child)
    return out


# --- the owner's side -------------------------------------------------------------------------------------

def _forget_after_fork() -> None:
    """In a forked child: close the inherited write end (only the owner's death may close the pipe)."""
    global _pipe, _warden, _owner_pid
    if _pipe is not None:
        try:
            _pipe.close()
        except OSError:
            pass
    _pipe, _warden, _owner_pid = None, None, None
    _containers_sent.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


def _send(message: dict[str, Any]) -> None:
    """Write one message to this process's warden, starting the warden first if there is none."""
    global _pipe, _warden, _owner_pid
    with _lock:
        if _warden is None or _warden.poll() is not None or _owner_pid != os.getpid():
            _warden = subprocess.Popen(
                [sys.executable, "-m", "agentrl.core.utils.lifeline"], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, start_new_session=True, close_fds=True,
            )  # fmt: skip
            _pipe, _owner_pid = _warden.stdin, os.getpid()
            _containers_sent.clear()
        assert _pipe is not None
        _pipe.write((json.dumps(message) + "\n").encode())
        _pipe.flush()


def own_process(pid: int) -> None:
    """This process owns ``pid``, its process group and its descendants: they end when this process ends."""
    st = _stat(pid)
    if st is not None:
        _send({"own": pid, "start": st[2]})


def release_process(pid: int) -> None:
    """``pid`` was stopped by its owner (or handed on): the warden forgets it and everything it started."""
    if _warden is not None and _owner_pid == os.getpid():
        _send({"release": pid})


def own_containers(docker_host: str, labels: dict[str, str]) -> None:
    """This process owns the containers carrying every one of ``labels`` on the engine at ``docker_host``:
    they are removed (forced, with their volumes) when this process ends. Repeated calls are free."""
    key = json.dumps([docker_host, sorted(labels.items())])
    if key in _containers_sent and _owner_pid == os.getpid():
        return
    _send({"containers": labels, "docker_host": docker_host})
    _containers_sent.add(key)


def warden_pid() -> int | None:
    """The pid of this process's warden, if it started one (for tests and diagnostics)."""
    return _warden.pid if _warden is not None and _owner_pid == os.getpid() else None


# --- the warden -------------------------------------------------------------------------------------------

def _signal_all(procs: dict[int, str], sig: int) -> None:
    for pid, start in procs.items():
        if _same(pid, start):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def end_processes(procs: dict[int, str], grace_s: float = GRACE_S) -> int:
    """SIGTERM each of ``procs`` (pid -> start time) that is still that process, SIGKILL what is left after
    ``grace_s``; returns how many had to be signalled."""
    alive = {pid: s for pid, s in procs.items() if _same(pid, s)}
    _signal_all(alive, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not any(_same(pid, s) for pid, s in alive.items()):
            return len(alive)
        time.sleep(0.05)
    _signal_all(alive, signal.SIGKILL)
    return len(alive)


def _remove_containers(docker_host: str, labels: dict[str, str]) -> int:
    import docker

    client = docker.DockerClient(base_url=docker_host, timeout=30)
    try:
        found = client.containers.list(all=True, filters={"label": [f"{k}={v}" for k, v in labels.items()]})
        for c in found:
            try:
                c.remove(force=True, v=True)
            except docker.errors.NotFound:
                pass
        return len(found)
    finally:
        client.close()


def _log(msg: str) -> None:
    try:
        print(f"agentrl warden {os.getpid()}: {msg}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass  # the owner's stderr may be gone with it


def warden_main() -> int:
    """Read declarations from stdin until end-of-file, then end what is owned (see the module docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the owner; EOF follows it
    fd = sys.stdin.fileno()
    roots: dict[int, str] = {}
    known: dict[int, str] = {}  # every owned process seen alive, kept after its parent died
    containers: list[tuple[str, dict[str, str]]] = []
    buf = b""
    eof = False
    while not eof:
        ready, _, _ = select.select([fd], [], [], SCAN_S)
        if ready:
            chunk = os.read(fd, 65536)
            eof = not chunk
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if "own" in msg:
                    roots[int(msg["own"])] = str(msg["start"])
                elif "release" in msg:
                    pid = int(msg["release"])
                    if pid in roots:
                        gone = owned_processes({pid: roots.pop(pid)}, process_table())
                        for p in (pid, *gone):
                            known.pop(p, None)
                elif "containers" in msg:
                    containers.append((str(msg["docker_host"]), dict(msg["containers"])))
        if roots:
            table = process_table()
            known = {p: s for p, s in known.items() if p in table and table[p][2] == s}
            known.update(owned_processes(roots, table))
    if roots:  # one last look: children started since the last scan count too
        known.update(owned_processes(roots, process_table()))
    n = end_processes(known) if known else 0
    removed = 0
    for host, labels in containers:
        try:
            removed += _remove_containers(host, labels)
        except Exception as e:  # the engine may be gone too; sandbox gc is the second line
            _log(f"could not remove containers {labels} on {host}: {e!r}")
    if n or removed:
        _log(f"owner gone: ended {n} process(es), removed {removed} container(s)")
    return 0


if __name__ == "__main__":
    sys.exit(warden_main())
