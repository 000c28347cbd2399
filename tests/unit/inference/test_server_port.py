"""An engine's port: held from the moment it is chosen until the engine listens on it, and an engine is
healthy only when its own process answers there (engines started side by side once shared a port, and one
family's requests reached another family's model)."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agentrl.inference import VLLMServer, VLLMServerConfig
from agentrl.inference import server as engine

HEALTH_SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H)
s.handle_request(); s.handle_request()
"""


def test_a_held_port_is_given_to_no_other_bind_but_the_server_can_listen_on_it() -> None:
    held = engine._hold_port("127.0.0.1", 0)
    port = held.getsockname()[1]
    try:
        for _ in range(3000):  # what the next engine's own hold (or any free-port lookup) does
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", 0))
                assert s.getsockname()[1] != port
        with socket.socket() as server:  # as vLLM binds: SO_REUSEADDR, then listen
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", port))
            server.listen()
            with pytest.raises(engine.ServerStartError, match=f"cannot serve on 127.0.0.1:{port}"):
                engine._hold_port("127.0.0.1", port)  # a listening port is taken
    finally:
        held.close()


def _engine(tmp_path: Path, port: int, cmd: list[str]) -> VLLMServer:
    server = VLLMServer(VLLMServerConfig(model=str(tmp_path), startup_timeout_s=30), tmp_path)
    server.port = port
    server.log_dir.mkdir(parents=True, exist_ok=True)
    server.log_path.write_text("")
    server.proc = subprocess.Popen(cmd)
    return server


def test_health_answered_by_another_process_is_not_this_engines(tmp_path: Path) -> None:
    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a: object) -> None:
            pass

    other = http.server.HTTPServer(("127.0.0.1", 0), Ok)  # another engine that took the port first
    threading.Thread(target=other.serve_forever, daemon=True).start()
    server = _engine(tmp_path, other.server_address[1], [sys.executable, "-c", "import time; time.sleep(3)"])
    try:
        t0 = time.monotonic()
        with pytest.raises(engine.ServerStartError, match="exited with code 0 during startup .another process "
                                                          f"answers on port {server.port}"):
            server._wait_healthy(time.monotonic() + 30)
        assert time.monotonic() - t0 >= 2.5  # not taken for healthy while it ran
    finally:
        other.shutdown()
        server.proc.wait()


def test_health_answered_by_the_engines_own_process(tmp_path: Path) -> None:
    port = engine._hold_port("127.0.0.1", 0)
    server = _engine(tmp_path, port.getsockname()[1],
                     [sys.executable, "-c", HEALTH_SERVER, str(port.getsockname()[1])])
    try:
        server._wait_healthy(time.monotonic() + 30)
        assert engine.listens_on(server.proc.pid, server.port)
    finally:
        port.close()
        server.proc.kill()
        server.proc.wait()


def test_a_forked_child_closes_its_copies_of_the_server_sockets_and_only_those() -> None:
    """What the forked engine core does first. vLLM binds the API server's socket before it forks the engine
    core and listens on it after: the child's copy would keep the port taken after the server died (a restart
    on the port failed while the engine core was still dying)."""
    import os

    from agentrl.core.utils.procs import close_server_sockets, listens_on

    server = socket.socket()  # bound before the fork, listening after it (as vLLM's)
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    listener = socket.socket()  # already listening at the fork
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    peer = socket.create_connection(listener.getsockname(), timeout=5)  # connected: kept
    udp = socket.socket(type=socket.SOCK_DGRAM)  # kept
    unbound = socket.socket()  # kept
    left, right = socket.socketpair()  # a Unix socket pair: kept
    kept = (peer, udp, unbound, left)
    try:
        pid = os.fork()
        if pid == 0:  # the child reports through its exit status (pytest must not run on in it)
            code = 1
            try:
                closed = close_server_sockets()
                still = all(os.fstat(s.fileno()) for s in kept)  # raises if one was closed
                time.sleep(0.5)  # the parent listens meanwhile
                code = 0 if closed == 2 and still and listens_on(os.getpid(), port) is False else 1
            finally:
                os._exit(code)
        server.listen()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert listens_on(os.getpid(), port) is True  # the parent's socket listens
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        for s in (server, listener, *kept, right):
            s.close()
