"""Request limits: a cap on body size (an ASGI middleware) and admission of sessions per client."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from agentrl.http.errors import ApiError

Scope = dict[str, Any]


async def _send_413(send: Any, limit: int) -> None:
    body = json.dumps(
        {
            "error": "payload_too_large",
            "detail": None,
            "message": f"request body larger than the server's limit of {limit} bytes",
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """ASGI middleware: answer HTTP 413 for bodies over ``max_bytes`` (declared or streamed), before the
    app reads them; the body is buffered (bounded) and replayed to the app."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.max_bytes:
                    await _send_413(send, self.max_bytes)
                    return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await _send_413(send, self.max_bytes)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class Admission:
    """Counts open sessions (total and per client) and refuses new ones past the limits with HTTP 429."""

    def __init__(self, max_total: int, max_per_client: int) -> None:
        self.max_total = max_total
        self.max_per_client = max_per_client
        self.per_client: Counter[str] = Counter()

    @property
    def total(self) -> int:
        """Sessions admitted and not yet released."""
        return sum(self.per_client.values())

    def admit(self, client: str) -> None:
        """Reserve a slot for ``client`` or raise ``ApiError(429)``."""
        if self.total >= self.max_total:
            raise ApiError(
                429,
                f"session limit reached ({self.max_total} open sessions on this server); close "
                "sessions or retry later",
                headers={"Retry-After": "1"},
            )
        if self.per_client[client] >= self.max_per_client:
            raise ApiError(
                429,
                f"per-client session limit reached ({self.max_per_client} open sessions from "
                f"{client}); close sessions or retry later",
                headers={"Retry-After": "1"},
            )
        self.per_client[client] += 1

    def release(self, client: str) -> None:
        """Give back ``client``'s slot."""
        self.per_client[client] -= 1
        if self.per_client[client] <= 0:
            del self.per_client[client]
