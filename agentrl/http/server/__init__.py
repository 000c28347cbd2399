"""The hosted environment server (``agentrl serve-env``): agentrl environments over HTTP.

* :func:`create_app` builds the FastAPI application for a :class:`ServerConfig`;
* :func:`serve` runs it with uvicorn (token, owner id for sandbox cleanup, graceful shutdown);
* the wire protocol is in :mod:`agentrl.http.server.protocol`; the client side is ``agentrl.RemoteEnvironment``.

The protocol is described with curl examples in docs/env-server.md.
"""

from __future__ import annotations

from typing import Any

from agentrl.config.server import ServerConfig, load_server_config

__all__ = ["ServerConfig", "create_app", "load_server_config", "serve"]


def __getattr__(name: str) -> Any:
    """Lazy exports: importing the package does not import FastAPI or uvicorn."""
    if name == "create_app":
        from agentrl.http.server.app import create_app

        return create_app
    if name == "serve":
        from agentrl.http.server.run import serve

        return serve
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
