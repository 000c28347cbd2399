"""Bearer-token authentication: one shared token, compared in constant time."""

from __future__ import annotations

import hmac
import json
import secrets
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from agentrl.core.errors import ConfigError
from agentrl.http.errors import ApiError

PUBLIC_PATHS = frozenset({"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
"""Routes that need no token: liveness and the API description."""

CAPABILITY_PREFIX = "/openenv/"
"""Routes under this prefix carry their credential in the path (a capability URL) and check it themselves."""

TOKEN_ENV = "AGENTRL_ENV_TOKEN"
"""Environment variable holding the token, for the server (when ``--token`` is not given) and clients."""

bearer = HTTPBearer(
    auto_error=False,
    description="`Authorization: Bearer <token>`; the token is printed "
    "by `agentrl serve-env` at start unless given with --token or $AGENTRL_ENV_TOKEN.",
)


class TokenError(ConfigError, ValueError):
    """A service's bearer token is missing, or too short to be safe (``$AGENTRL_ENV_TOKEN``)."""

    code = "config.service_token"


def generate_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def make_auth(token: str | None) -> Callable[..., Coroutine[Any, Any, None]]:
    """A dependency that accepts requests bearing ``token`` (every request when ``token`` is None)."""
    expected = token.encode() if token else None

    async def check(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if expected is None:
            return
        if credentials is None:
            raise ApiError(
                401,
                "missing bearer token: send 'Authorization: Bearer <token>'",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not hmac.compare_digest(credentials.credentials.encode("utf-8", "replace"), expected):
            raise ApiError(
                401, "invalid bearer token", headers={"WWW-Authenticate": 'Bearer error="invalid_token"'}
            )

    return check


def _matches(header: bytes, expected: bytes) -> bool:
    scheme, _, credentials = header.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), expected)


class BearerAuth:
    """ASGI middleware: refuse requests without the token (HTTP 401) before their body is even read, so
    unauthenticated clients learn nothing from validation errors. ``PUBLIC_PATHS`` are exempt."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.expected = token.encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in PUBLIC_PATHS or path.startswith(CAPABILITY_PREFIX):
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)
        if header is not None and _matches(header, self.expected):
            await self.app(scope, receive, send)
            return
        message = (
            "missing bearer token: send 'Authorization: Bearer <token>'"
            if header is None
            else "invalid bearer token"
        )
        body = json.dumps({"error": "unauthorized", "message": message, "detail": None}).encode()
        challenge = b"Bearer" if header is None else b'Bearer error="invalid_token"'
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", challenge),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
