"""A minimal keep-alive HTTP/1.1 JSON client on asyncio streams, for load generation only.

With dozens of concurrent requests a general-purpose async client spends more CPU than the server under
test (on a 2-CPU machine that caps the measured throughput at the client). This one does one request at
a time per connection, ``Content-Length`` or chunked bodies, and nothing else: no TLS, no redirects.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

from agentrl.core.errors import AgentRLError
from agentrl.tools.bench.errors import BenchArgumentError


class HttpError(AgentRLError, ConnectionError):
    """The connection failed or the answer was not HTTP/1.1 as expected."""

    code = "bench.http"


class Connection:
    """One keep-alive connection to ``base_url`` (reconnects when the server closes it)."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None, timeout_s: float = 60.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise BenchArgumentError(f"only http:// URLs are supported, not {base_url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.headers = {"Host": f"{self.host}:{self.port}", **(headers or {})}
        self.timeout_s = timeout_s
        self._r: asyncio.StreamReader | None = None
        self._w: asyncio.StreamWriter | None = None

    async def _connect(self) -> None:
        self._r, self._w = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port), self.timeout_s
        )

    async def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        """(status, decoded JSON body or None)."""
        return await asyncio.wait_for(self._request(method, path, body, headers), self.timeout_s)

    async def _request(
        self, method: str, path: str, body: Any, headers: dict[str, str] | None
    ) -> tuple[int, Any]:
        payload = b"" if body is None else json.dumps(body).encode()
        head = {**self.headers, **(headers or {}), "Content-Length": str(len(payload))}
        if body is not None:
            head["Content-Type"] = "application/json"
        data = (
            f"{method} {path} HTTP/1.1\r\n".encode()
            + b"".join(f"{k}: {v}\r\n".encode() for k, v in head.items())
            + b"\r\n"
            + payload
        )
        failed: Exception | None = None
        for _ in range(2):  # one reconnect: the server may have closed an idle connection
            if self._w is None:
                await self._connect()
            assert self._r is not None and self._w is not None
            try:
                self._w.write(data)
                await self._w.drain()
                status_line = await self._r.readline()
                if not status_line:
                    raise HttpError("connection closed")
                return await self._read_response(status_line)
            except (HttpError, ConnectionError, asyncio.IncompleteReadError) as e:
                await self.close()
                failed = e
        raise HttpError(f"{type(failed).__name__}: {failed}") from failed

    async def _read_response(self, status_line: bytes) -> tuple[int, Any]:
        assert self._r is not None
        try:
            status = int(status_line.split()[1])
        except (IndexError, ValueError):
            raise HttpError(f"bad status line {status_line[:100]!r}") from None
        length, chunked, close = 0, False, False
        while True:
            line = await self._r.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding" and "chunked" in value:
                chunked = True
            elif name == "connection" and value == "close":
                close = True
        if chunked:
            raw = bytearray()
            while True:
                size = int((await self._r.readline()).split(b";")[0], 16)
                if size == 0:
                    await self._r.readline()
                    break
                raw += await self._r.readexactly(size)
                await self._r.readexactly(2)
            content = bytes(raw)
        else:
            content = await self._r.readexactly(length)
        if close:
            await self.close()
        return status, json.loads(content) if content else None

    async def close(self) -> None:
        """Close the connection (a later request reconnects)."""
        w, self._w, self._r = self._w, None, None
        if w is not None:
            w.close()
            try:
                await w.wait_closed()
            except (ConnectionError, OSError):
                pass
