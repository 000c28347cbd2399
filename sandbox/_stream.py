"""Blocking exec over a hijacked engine connection, read with a hard host-side deadline.

The SDK's ``exec_run`` buffers all output in memory and cannot be abandoned; this reads the multiplexed
stream frame by frame into bounded sinks and gives up at ``deadline`` (the socket is closed; the caller
then kills the processes inside the container)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

from ._util import FrameParser

Sink = Callable[[int, bytes], None]


def _hijack(api: Any, exec_id: str) -> tuple[Any, socket.socket, bytes]:
    """Start exec ``exec_id`` attached; return (response, raw socket, bytes already buffered by http.client).

    The response headers are parsed through a buffered reader that may have read the first output frames
    too (fast commands such as ``echo ok``); those bytes are drained here so that nothing is lost.
    """
    res = api._post_json(api._url("/exec/{0}/start", exec_id), headers={"Connection": "Upgrade", "Upgrade": "tcp"},
                         data={"Tty": False, "Detach": False}, stream=True)
    api._raise_for_status(res)
    fp = res.raw._fp.fp  # the BufferedReader http.client parsed the headers with (as the SDK does)
    raw_io = fp.raw
    sock: socket.socket = getattr(raw_io, "_sock", raw_io)
    sock.setblocking(False)
    pre = b""
    try:
        while True:  # drain what is buffered, without blocking
            chunk = fp.read1(1 << 16)
            if not chunk:
                break
            pre += chunk
    except (BlockingIOError, ValueError, OSError):
        pass
    finally:
        sock.setblocking(True)
    return res, sock, pre


def run_exec(api: Any, container_id: str, argv: list[str], *, user: str, workdir: str | None,
             env: dict[str, str] | None, deadline_s: float, sink: Sink,
             on_socket: Callable[[socket.socket], None] | None = None) -> tuple[int | None, bool]:
    """Run ``argv`` in the container, streaming frames to ``sink``; returns ``(exit_code, host_timed_out)``.

    ``exit_code`` is None when the host gave up (deadline passed or the connection was shut down).
    ``on_socket`` receives the connection so another thread can abort the read (``shutdown``).
    """
    deadline = time.monotonic() + deadline_s
    ex = api.exec_create(container_id, argv, stdout=True, stderr=True, stdin=False, tty=False, user=user,
                         workdir=workdir, environment=env)
    exec_id = ex["Id"]
    res, sock, pre = _hijack(api, exec_id)
    if on_socket is not None:
        on_socket(sock)
    parser = FrameParser()
    gave_up = False
    try:
        data = pre
        while True:
            for stream, payload in parser.feed(data):
                sink(stream, payload)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                gave_up = True
                break
            sock.settimeout(remaining)
            try:
                data = sock.recv(1 << 16)
            except TimeoutError:
                gave_up = True
                break
            except OSError:
                gave_up = True  # shut down by another thread (cancellation)
                break
            if not data:
                break
    finally:
        try:
            sock.close()
        finally:
            res.close()
    if gave_up:
        return None, True
    # The stream ends a hair before the engine records the exit code.
    for i in range(200):
        info = api.exec_inspect(exec_id)
        if not info.get("Running"):
            return info.get("ExitCode"), False
        if time.monotonic() > deadline:
            return None, True
        time.sleep(0.002 if i < 20 else 0.02)
    return None, True
