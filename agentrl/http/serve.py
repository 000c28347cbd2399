"""Binding the listening socket of an agentrl HTTP service and the URL it is reached at."""

from __future__ import annotations

import socket

from agentrl.core.errors import ConfigError


class BindError(ConfigError, OSError):
    """The listening socket cannot be set up where asked: a host that does not resolve, a port in use, a
    path that cannot be bound."""

    code = "config.bind"


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one). Raises :class:`BindError` (an
    ``OSError``) with a clear message."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise BindError(f"cannot resolve host {host!r}: {e}") from e
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise BindError(f"cannot serve on {host}:{port}: {e.strerror or e}") from e
    sock.set_inheritable(True)
    return sock


def bind_unix_socket(path: str) -> socket.socket:
    """A listening Unix socket at ``path`` (a stale file there is replaced), connectable by every user: what
    reaches it is checked by the server's keys, as on a loopback port."""
    import contextlib
    import os

    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, 0o666)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise BindError(f"cannot serve on {path}: {e.strerror or e}") from e
    return sock


def url_of(sock: socket.socket) -> str:
    """``http://host:port`` of a bound socket."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
