"""Capability URLs: the credential of OpenEnv and MCP clients, carried in the URL's path.

Stock OpenEnv clients (``openenv-core``'s ``EnvClient``, ``MCPToolClient``) send no headers; they derive
every URL from one base URL (``<base>/ws``, ``<base>/mcp``). So their credential is a path segment:
``<server>/openenv/<capability>``. A capability names a client and carries an HMAC of that name keyed by
the server's bearer token, so each client gets its own URL, no state is stored, and a capability cannot
be forged or altered without the token.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from agentrl.core.errors import ConfigError

PREFIX = "/openenv"
"""Path prefix of every OpenEnv and MCP route; the capability is the next path segment."""

DEFAULT_CLIENT = "default"
"""Client name of the capability printed at start."""

NO_AUTH = "open"
"""The capability segment of a server running without authentication (any segment is accepted then)."""

CLIENT_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
"""What a client name may be."""

_CLIENT_RE = re.compile(CLIENT_PATTERN)


class ClientNameError(ConfigError, ValueError):
    """A capability was asked for a client name that does not match :data:`CLIENT_PATTERN`."""

    code = "config.openenv_client"


def _mac(token: str, client: str) -> str:
    return hmac.new(token.encode(), f"openenv-client:{client}".encode(), hashlib.sha256).hexdigest()[:32]


def mint(token: str | None, client: str = DEFAULT_CLIENT) -> str:
    """The capability of ``client`` (``<client>.<mac>``); ``NO_AUTH`` when the server has no token."""
    if not _CLIENT_RE.match(client):
        raise ClientNameError(f"client name {client[:80]!r} must match {CLIENT_PATTERN}")
    if token is None:
        return NO_AUTH
    return f"{client}.{_mac(token, client)}"


def verify(token: str | None, capability: str) -> str | None:
    """The client a capability names, or None when it is not valid (any capability without a token)."""
    if token is None:
        return DEFAULT_CLIENT
    client, dot, mac = capability.rpartition(".")
    if not dot or not _CLIENT_RE.match(client) or len(mac) != 32:
        return None
    return client if hmac.compare_digest(mac.encode(), _mac(token, client).encode()) else None


def base_url(server_url: str, token: str | None, client: str = DEFAULT_CLIENT) -> str:
    """The base URL an OpenEnv client of ``client`` is given (``<server>/openenv/<capability>``)."""
    return f"{server_url.rstrip('/')}{PREFIX}/{mint(token, client)}"
