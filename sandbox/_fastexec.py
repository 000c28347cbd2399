"""Fast exec path: one long-lived helper process per sandbox that runs commands on request.

A ``docker exec`` costs one ``runc exec`` (tens of milliseconds, more on a loaded host); the helper forks
the same ``timeout ... sh -c CMD`` argv in a few milliseconds. It runs as the sandbox user (no extra
privilege: it is as untrusted as the commands), speaks over the exec's attached stdin/stdout, and is
simply replaced when it dies (a command may kill it; a timeout's reaper does). Replies are parsed with
size bounds, so a tampered helper can garble only its own sandbox's results.

Requests: one JSON line ``{"argv": [...], "cwd": str, "env": {...}}``, or ``{"reap": true}``: stop, then kill,
every other process of the sandbox user, with no fork (so it works when the process table is full). Replies: frames of
``kind (1 byte) + big-endian length (4 bytes) + payload``: ``h`` hello, ``o`` output, ``x`` exit status
(``-11``: the command could not be spawned, EAGAIN: the sandbox is at its pids limit).
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from typing import Any

from ._engine import SandboxError
from ._stream import Sink, _hijack
from ._util import FrameParser

SERVER_SRC = r"""
import errno, json, os, select, struct, subprocess, sys, time
out = sys.stdout.buffer
ME, UID = os.getpid(), "\nUid:\t%d\t" % os.getuid()
def user_states():  # the state letter (R, S, T, Z, ...) of every other process of this user
    states = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != ME:
            try:
                with open("/proc/" + d + "/status") as f:
                    st = f.read()
            except OSError:
                continue
            i = st.find("\nState:\t")
            if UID in st and i >= 0:
                states.append(st[i + 8])
    return states
def send(kind, data):
    out.write(struct.pack(">cI", kind, len(data)) + data); out.flush()
send(b"h", b"")
for line in sys.stdin.buffer:
    req = json.loads(line)
    if req.get("reap"):  # kill every other process of this user without forking (works at the pids limit)
        left, until = -1, time.monotonic() + 8
        while time.monotonic() < until:
            try:
                os.kill(-1, 19)  # SIGSTOP: a stopped process cannot fork
            except OSError:
                pass
            states = user_states()
            if any(s not in "TtZX" for s in states):  # one still runs (it may be forking): stop again
                select.select([], [], [], 0.002)
                continue
            try:  # every one is stopped: none can fork, so this kill reaches all of them
                os.kill(-1, 9)
            except OSError:
                pass
            select.select([], [], [], 0.01)
            left = sum(s not in "ZX" for s in user_states())
            if not left:
                break
        send(b"x", str(left).encode()); continue
    env = dict(os.environ); env.update(req.get("env") or {})
    try:
        p = subprocess.Popen(req["argv"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, cwd=req.get("cwd") or None, env=env)
    except OSError as e:
        send(b"o", (str(e) + "\n").encode())
        send(b"x", b"-11" if e.errno == errno.EAGAIN else b"127"); continue
    fd = p.stdout.fileno()
    exited = False
    while True:
        # once it has exited, look without waiting: that takes what it wrote between the last look and its
        # exit, and stops at the first empty look (background processes may hold the pipe open)
        if select.select([fd], [], [], 0 if exited else 0.05)[0]:
            d = os.read(fd, 65536)
            if not d:
                break
            send(b"o", d)
        elif exited:
            break
        else:
            exited = p.poll() is not None
    p.stdout.close()
    send(b"x", str(p.wait()).encode())
"""
MAX_FRAME = 1 << 20
SPAWN_EAGAIN = -11


class HelperBroken(SandboxError):
    """The helper died or sent garbage (the caller restarts it)."""

    code = "sandbox.helper_broken"


class HelperTimeout(SandboxError, TimeoutError):
    """The helper's next reply did not come before the deadline (the caller gives up on the command)."""

    code = "sandbox.helper_timeout"


class ExecHelper:
    """Host side of the helper (blocking; call from a worker thread). One request at a time."""

    def __init__(self, api: Any, container_id: str, user: str, start_timeout_s: float = 10) -> None:
        self.lock = threading.Lock()
        self.alive = False
        ex = api.exec_create(container_id, ["python3", "-I", "-S", "-u", "-c", SERVER_SRC], stdin=True,
                             stdout=True, stderr=True, tty=False, user=user, workdir="/")
        self._res, self._sock, pre = _hijack(api, ex["Id"])
        self._frames = FrameParser()
        self._buf = bytearray()
        self._pending = pre
        kind, _ = self._next(time.monotonic() + start_timeout_s)
        if kind != b"h":
            raise HelperBroken(f"unexpected hello {kind!r}")
        self.alive = True

    def _next(self, deadline: float) -> tuple[bytes, bytes]:
        """Next reply frame; raises HelperTimeout (a TimeoutError) at ``deadline``, HelperBroken on EOF/garbage."""
        while True:
            if len(self._buf) >= 5:
                kind, size = struct.unpack(">cI", self._buf[:5])
                if kind not in (b"h", b"o", b"x") or size > MAX_FRAME:
                    raise HelperBroken(f"bad frame from helper ({kind!r}, {size})")
                if len(self._buf) >= 5 + size:
                    payload = bytes(self._buf[5 : 5 + size])
                    del self._buf[: 5 + size]
                    return kind, payload
            data, self._pending = self._pending, b""
            if not data:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise HelperTimeout
                self._sock.settimeout(remaining)
                try:
                    data = self._sock.recv(1 << 16)
                except (TimeoutError, BlockingIOError):
                    raise HelperTimeout from None
                except OSError as e:
                    raise HelperBroken(str(e)) from e
                if not data:
                    raise HelperBroken("helper exited")
            for stream, payload in self._frames.feed(data):
                if stream == 1:
                    self._buf += payload
                if len(self._buf) > 2 * MAX_FRAME:
                    raise HelperBroken("helper output not framed")

    def run(self, argv: list[str], cwd: str, env: dict[str, str] | None, deadline_s: float,
            sink: Sink) -> tuple[int | None, bool]:
        """Run ``argv``; returns ``(exit_code, host_gave_up)``. Raises HelperBroken if the helper failed
        before anything was sent (safe to retry elsewhere); a helper dying mid-command reads as exit 137."""
        deadline = time.monotonic() + deadline_s
        line = json.dumps({"argv": argv, "cwd": cwd, "env": env or {}}).encode() + b"\n"
        try:
            self._sock.sendall(line)
        except OSError as e:
            self.close()
            raise HelperBroken(str(e)) from e
        try:
            while True:
                kind, payload = self._next(deadline)
                if kind == b"o":
                    sink(1, payload)
                elif kind == b"x":
                    return int(payload.decode() or "-1"), False
        except HelperTimeout:
            self.close()
            return None, True
        except (HelperBroken, ValueError):
            self.close()  # killed by the command itself (e.g. kill -9 -1) or tampered with
            return 137, False

    def reap(self, deadline_s: float = 10) -> bool:
        """Kill every other process of the sandbox user from the helper itself (no new process needed, so it
        works at the pids limit); False when the helper failed (the caller falls back to an exec)."""
        deadline = time.monotonic() + deadline_s
        try:
            self._sock.sendall(b'{"reap": true}\n')
            while True:
                kind, payload = self._next(deadline)
                if kind == b"x":
                    return payload == b"0"
        except (HelperTimeout, HelperBroken, OSError, ValueError):
            self.close()
            return False

    def close(self) -> None:
        """Drop the connection (the helper exits on EOF)."""
        self.alive = False
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._sock.close()
        finally:
            self._res.close()
