"""The engine's local control socket: the hot weight-sync sequence without HTTP.

Over HTTP a sync crosses the API server twice (the publisher's ``POST /collective_rpc``, then vLLM's request to
its engine core over ZMQ, and the answer back), plus a pause and a resume around it: milliseconds each, a
hundred times the in-place copy itself. A publisher on the engine's host instead opens this socket once
(``agentrl_open_control``, over HTTP) and sends each sync as one message:

1. a thread of the engine-core process receives it (a Unix ``SOCK_SEQPACKET`` socket in the abstract namespace,
   so no file is left behind; only a peer of the same user is accepted) and puts it on the engine core's input
   queue (:func:`agentrl.engine.vllm_patches.wake_core`), which wakes a loop idle on it;
2. the engine core's busy loop runs it **between two engine steps**, as it runs vLLM's own utility calls: the
   worker method (the in-place copy or the merge, from the publisher's shared-memory segment), then the new
   version's label and the prefix-cache reset. No step runs in between, so no token is sampled from a
   half-updated model or tagged with the wrong version: the pause and resume that HTTP needs are not needed;
3. the answer (each worker's record, the label and reset, and the time the message waited for a step to end)
   goes back on the same connection.

A merge that fails leaves a partial load: the engine core then pauses its scheduler (``keep``) in the same
call, so nothing is generated from the mix before the publisher takes the engine out of rotation.

Only an engine whose worker runs in its engine core (agentrl starts vLLM's CPU build that way) can open it;
others answer that they cannot and keep the HTTP path, as do engines on other hosts.

This module must import without vLLM and torch (the launcher imports the extension to check it).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import struct
import threading
import time
from typing import Any

from agentrl.core.errors import WeightSyncError
from agentrl.engine import vllm_patches
from agentrl.engine.slots import label_and_reset
from agentrl.weight_sync.base import BAD_REQUEST, UPDATE_REFUSED
from agentrl.weight_sync.worker_io import failure

ALLOWED = frozenset({"agentrl_update_lora", "agentrl_merge_lora"})
"""The worker methods a control message may run: the two hot syncs (everything else stays on HTTP)."""
MAX_MESSAGE = 1 << 22
"""Largest message read (4 MiB: an adapter's layout, never its tensors, which stay in shared memory)."""


class ControlMessageError(WeightSyncError, ValueError):
    """A control message that cannot be run: not JSON, or not one of the sync methods with its kwargs."""

    code = BAD_REQUEST


class _Kind:
    """The input-queue item kind of a control message (vLLM's own kinds are an enum: this never equals one)."""

    def __repr__(self) -> str:
        return "agentrl-control"


CONTROL = _Kind()


def peer_uid(conn: socket.socket) -> int:
    """The user id of the process at the other end of the Unix socket ``conn``."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


class ControlServer:
    """The engine core's end: a listening socket, one reader thread per connection, and the busy-loop hook
    that runs each message between two steps."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.address = f"agentrl-control-{os.getpid()}-{secrets.token_hex(6)}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.bind("\0" + self.address)
        self.sock.listen(16)
        vllm_patches.hook_core_requests(core, CONTROL, self._run)
        threading.Thread(target=self._accept, name="agentrl-control", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # pragma: no cover - the socket closed: the process is going away
                return
            if peer_uid(conn) != os.getuid():
                conn.close()
                continue
            threading.Thread(target=self._read, args=(conn,), name="agentrl-control-conn", daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        """Hand each message of ``conn`` to the busy loop; a message that cannot be read is answered here."""
        with conn:
            while True:
                try:
                    data = conn.recv(MAX_MESSAGE)
                except OSError:
                    return
                if not data:  # the publisher closed its end
                    return
                t_recv = time.perf_counter()
                msg: Any = None
                try:
                    msg = json.loads(data)
                    if msg.get("method") not in ALLOWED or not isinstance(msg.get("kwargs"), dict):
                        raise ControlMessageError(f"method must be one of {sorted(ALLOWED)}, with kwargs")
                except (ControlMessageError, ValueError, AttributeError) as exc:
                    _send(conn, {"id": msg.get("id") if isinstance(msg, dict) else None,
                                 "workers": [failure(BAD_REQUEST, f"unreadable control message: {exc}")]})
                    continue
                vllm_patches.wake_core(self.core, CONTROL, (conn, t_recv, msg))

    def _run(self, item: tuple[socket.socket, float, dict[str, Any]]) -> None:
        """In the busy loop, between two steps: the worker method, then the label and the reset if every worker
        applied it; a failed one with ``pause_on_failure`` freezes generation."""
        conn, t_recv, msg = item
        t0 = time.perf_counter()
        out: dict[str, Any] = {"id": msg.get("id"), "queue_ms": (t0 - t_recv) * 1e3, "version_set": False,
                               "prefix_reset": False}
        try:
            workers = self.core.collective_rpc(msg["method"], kwargs=msg["kwargs"])
        except Exception as exc:  # a worker method raised: a refusal, not the engine's end
            workers = [failure(UPDATE_REFUSED, f"{msg['method']} raised {exc!r}")]
        ok = bool(workers) and all(isinstance(w, dict) and w.get("ok") for w in workers)
        t1 = time.perf_counter()
        if ok:
            # an in-place copy labels its adapter (where labels are kept per adapter); a merge, the whole engine
            adapter = str(msg["kwargs"].get("adapter") or "") if msg["method"] == "agentrl_update_lora" else ""
            ops = label_and_reset(self.core, str(msg.get("version") or ""), str(msg.get("reset") or ""), adapter)
            out.update(version_set=ops["version_set"], prefix_reset=ops["prefix_reset"])
        elif msg.get("pause_on_failure"):
            vllm_patches.pause_core(self.core)
            out["paused"] = True
        out.update(workers=workers, rpc_ms=(t1 - t0) * 1e3, core_ms=(time.perf_counter() - t0) * 1e3)
        _send(conn, out)


def _send(conn: socket.socket, out: dict[str, Any]) -> None:
    try:
        conn.send(json.dumps(out, separators=(",", ":")).encode())
    except OSError:  # the publisher is gone; it republishes over HTTP when it comes back
        pass


class ControlMixin:
    """The worker-extension method that opens the control socket (called once per publisher, over HTTP)."""

    def agentrl_open_control(self) -> dict[str, Any]:
        """Open (once per process) the engine core's control socket and return its address, or a failure
        record when this worker has no engine core in its process (its own process: tensor parallelism)."""
        server = _SERVERS.get(os.getpid())
        if server is None:
            core = vllm_patches.find_engine_core()
            if core is None:
                return failure(UPDATE_REFUSED, "this worker does not run in its engine core's process: "
                                               "no local control socket (the HTTP path stays)")
            server = _SERVERS[os.getpid()] = ControlServer(core)
        return {"ok": True, "address": server.address, "pid": os.getpid()}


_SERVERS: dict[int, ControlServer] = {}
"""This process's control server (keyed by pid: a forked child must open its own)."""
