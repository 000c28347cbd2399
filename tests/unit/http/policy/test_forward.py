"""The agent container's forwarder: a loopback port forwarded to a Unix socket, then the program, whose exit
status it returns."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import agentrl.http.policy.forward as forward

FORWARD = Path(forward.__file__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_program_reaches_the_socket_through_the_port_and_its_status_is_returned(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def echo_upper() -> None:
        conn, _ = server.accept()
        with conn:
            conn.sendall(conn.recv(64).upper())

    threading.Thread(target=echo_upper, daemon=True).start()
    port = _free_port()
    program = (f"import socket, sys; s = socket.create_connection(('127.0.0.1', {port})); s.sendall(b'ping'); "
               "print(s.recv(64).decode()); sys.exit(7)")
    r = subprocess.run([sys.executable, str(FORWARD), path, str(port), "--", sys.executable, "-c", program],
                       capture_output=True, text=True, timeout=60)
    server.close()
    assert (r.returncode, r.stdout.strip()) == (7, "PING"), r.stderr


def test_bad_usage_and_a_missing_program() -> None:
    r = subprocess.run([sys.executable, str(FORWARD), "only-a-socket"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "PROGRAM" in r.stderr
    r = subprocess.run([sys.executable, str(FORWARD), "/nonexistent.sock", str(_free_port()), "--", "no-such-program"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 127 and "could not start" in r.stderr
