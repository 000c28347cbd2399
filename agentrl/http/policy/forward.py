"""Runs inside an agent program's container (``agent.image``): the policy endpoint at ``127.0.0.1:PORT``, forwarded
to the endpoint's Unix socket mounted into the container, then the agent program; exits with its status.

The container has no network (a loopback interface only), so the endpoint, through this socket, is its only
path out. Standard library only: it runs on the image's own ``python3``, without agentrl installed.

    python3 forward.py SOCKET PORT -- PROGRAM [ARGS...]
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def _serve(listener: socket.socket, path: str) -> None:
    while True:
        conn, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(path)
        except OSError:
            conn.close()
            upstream.close()
            continue
        for a, b in ((conn, upstream), (upstream, conn)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write(__doc__ or "")
        return 2
    path, port, program = argv[0], int(argv[1]), argv[3:]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(256)
    threading.Thread(target=_serve, args=(listener, path), daemon=True).start()
    try:
        return subprocess.call(program)
    except OSError as e:
        sys.stderr.write(f"the agent program could not start: {e}\n")
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
