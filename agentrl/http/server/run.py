"""Running the server process: token and owner id, the listening socket, uvicorn, graceful shutdown."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import sys

from agentrl.config.server import ServerConfig
from agentrl.http.auth import TOKEN_ENV, TokenError, generate_token
from agentrl.http.serve import bind_socket, url_of
from agentrl.http.server.capability import base_url as capability_url

log = logging.getLogger("agentrl.http.server")

OWNER_PREFIX = "env-server"


def resolve_token(config: ServerConfig) -> tuple[str | None, bool]:
    """(token, generated): ``config.token``, else ``$AGENTRL_ENV_TOKEN``, else a new one; None without auth."""
    if not config.auth:
        return None, False
    if config.token:
        return config.token, False
    env = os.environ.get(TOKEN_ENV, "")
    if env:
        if len(env) < 16:
            raise TokenError(f"${TOKEN_ENV} is too short: use at least 16 characters")
        return env, False
    return generate_token(), True


def serve(config: ServerConfig) -> None:
    """Serve until SIGINT/SIGTERM, then close every session and remove this server's sandboxes.

    Before serving, sandbox containers of dead drivers on this host (e.g. a server killed with ``kill -9``)
    are removed; the containers this server's environments start carry its owner id."""
    import uvicorn

    from agentrl.http.server.app import create_app

    token, generated = resolve_token(config)
    owner = config.owner or f"{OWNER_PREFIX}-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
    os.environ["AGENTRL_RUN_ID"] = owner  # the sandbox label of every container started from here
    config = config.model_copy(update={"owner": owner})
    app = create_app(config, token)
    sock = bind_socket(config.host, config.port)
    url = url_of(sock)
    print(
        f"agentrl env server: serving {', '.join(app.state.catalog.names)} on {url} (owner {owner})",
        file=sys.stderr,
        flush=True,
    )
    if token is None:
        print("agentrl env server: authentication is OFF (loopback only)", file=sys.stderr, flush=True)
    elif generated:
        print(
            f"agentrl env server: bearer token {token}  (set {TOKEN_ENV} or pass --token to choose one)",
            file=sys.stderr,
            flush=True,
        )
    print(f"openenv: {capability_url(url, token)}", file=sys.stderr, flush=True)
    uv = uvicorn.Config(
        app,
        log_level="info" if config.access_log else "warning",
        access_log=config.access_log,
        timeout_graceful_shutdown=10,
        timeout_keep_alive=30,
        server_header=False,
        ws_max_size=config.max_request_bytes,
    )
    server = uvicorn.Server(uv)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
