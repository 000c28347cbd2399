"""The publisher's end of the engines' local control sockets (:mod:`agentrl.engine.control`): a sync to an
engine on this host as one message, run by its engine core between two steps, instead of HTTP calls.

:func:`open_links` asks each engine once (over HTTP, ``agentrl_open_control``) for its socket and connects;
an engine that cannot open one (its worker in a process of its own, an older agentrl) or cannot be reached
(another host or network namespace) keeps the HTTP path. :class:`ControlledEngines` is the engine client a
shared-memory publisher talks to: its ``collective_rpc`` goes over the links where there are some and over
HTTP for the rest, and everything else (labels, resets, pauses, subsets) is the HTTP client's. A link that
fails or times out is dropped for good, and that engine is served over HTTP from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

from agentrl.core.errors import EngineError
from agentrl.weight_sync.base import UPDATE_REFUSED
from agentrl.weight_sync.inplace import worker_failures
from agentrl.weight_sync.rotation import live_urls
from agentrl.weight_sync.worker_io import failure

log = logging.getLogger(__name__)

OPEN_METHOD = "agentrl_open_control"
MAX_REPLY = 1 << 22


class ControlLinkError(EngineError):
    """A control link broke or timed out: its engine is served over HTTP from now on."""

    code = "weight_sync.control_link"

    def __init__(self, message: str, endpoint: str = "") -> None:
        super().__init__(message)
        self.endpoint = endpoint


class ControlLink:
    """One connection to one engine's control socket (one call at a time)."""

    def __init__(self, url: str, address: str, sock: socket.socket) -> None:
        self.url = url
        self.address = address
        self.sock: socket.socket | None = sock
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()

    @classmethod
    async def connect(cls, url: str, address: str, timeout_s: float = 5.0) -> ControlLink:
        """Connect to the abstract Unix socket ``address`` of the engine at ``url``."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, "\0" + address), timeout_s)
        except BaseException:
            sock.close()
            raise
        return cls(url, address, sock)

    @property
    def alive(self) -> bool:
        """Whether the link can still carry a call."""
        return self.sock is not None

    async def call(self, method: str, kwargs: dict[str, str], *, version: str = "", reset: str = "",
                   pause_on_failure: bool = False, timeout_s: float = 30.0) -> dict[str, Any]:
        """Run ``method`` with ``kwargs`` in the engine core between two steps, then (if every worker applied
        it) label ``version`` and reset the prefix cache (``reset``: "1", or "running": also preempt running
        requests); ``pause_on_failure``: freeze generation if it failed. The engine's answer."""
        if self.sock is None:
            raise ControlLinkError(f"the control link to {self.url} is closed")
        msg_id = next(self._ids)
        data = json.dumps({"id": msg_id, "method": method, "kwargs": kwargs, "version": version, "reset": reset,
                           "pause_on_failure": pause_on_failure}, separators=(",", ":")).encode()
        loop = asyncio.get_running_loop()
        async with self._lock:
            try:
                async with asyncio.timeout(timeout_s):
                    await loop.sock_sendall(self.sock, data)
                    reply = await loop.sock_recv(self.sock, MAX_REPLY)
            except (OSError, TimeoutError) as exc:
                self.close()
                raise ControlLinkError(f"the control link to {self.url} failed ({type(exc).__name__}: {exc}); "
                                       "it is served over HTTP from now on", endpoint=self.url) from exc
        if not reply:
            self.close()
            raise ControlLinkError(f"{self.url} closed its control socket (the engine stopped?)", endpoint=self.url)
        out = json.loads(reply)
        if out.get("id") != msg_id:  # cannot happen with one call at a time; never trust a mismatched answer
            self.close()
            raise ControlLinkError(f"{self.url} answered control message {out.get('id')}, not {msg_id}",
                                   endpoint=self.url)
        return out

    def close(self) -> None:
        """Close the connection (idempotent); the engine's reader thread ends with it."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None


async def open_links(engines: Any, urls: list[str], timeout_s: float = 30.0) -> dict[str, ControlLink]:
    """A control link to each engine of ``urls`` that can open one (the others are left out: HTTP)."""

    async def one(url: str) -> ControlLink | None:
        try:
            workers = (await engines.subset([url]).collective_rpc(OPEN_METHOD, timeout=timeout_s))[0]
        except EngineError as exc:
            log.info("engine %s keeps the HTTP sync path: %s", url, exc)
            return None
        if len(workers) != 1 or worker_failures(workers) or not workers[0].get("address"):
            log.info("engine %s keeps the HTTP sync path: %s", url, "; ".join(worker_failures(workers))
                     or f"{len(workers)} workers")
            return None
        try:
            return await ControlLink.connect(url, workers[0]["address"])
        except (OSError, TimeoutError) as exc:  # another network namespace: the socket is not visible here
            log.info("engine %s keeps the HTTP sync path: cannot reach its control socket (%s)", url, exc)
            return None

    links = await asyncio.gather(*(one(u) for u in urls))
    return {u: link for u, link in zip(urls, links, strict=True) if link is not None}


def _down(url: str) -> dict[str, Any]:
    """The record an engine out of rotation holds in a ``collective_rpc`` answer (as the HTTP client's)."""
    return {"ok": False, "down": True, "error": f"{url} is out of rotation"}


class ControlledEngines:
    """An engine client whose ``collective_rpc`` takes the control links it has and HTTP for the rest; every
    other attribute is the HTTP client's (``engine``). Its results are in ``engine.endpoints`` order, one
    list of worker records per endpoint, as over HTTP; a record that came over a link also carries the engine
    core's ``version_set``, ``prefix_reset`` and ``control_queue_ms`` (the time the message waited for a step
    to end)."""

    def __init__(self, engine: Any, links: dict[str, ControlLink]) -> None:
        self.engine = engine
        self.links = links

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    @property
    def endpoints(self) -> list[str]:
        """The engines served, as the HTTP client lists them."""
        return list(self.engine.endpoints)

    @property
    def atomic(self) -> bool:
        """Whether every engine takes its syncs over a live link (each applied between two engine steps, with
        its label: no pause is needed around it)."""
        return bool(self.endpoints) and all(u in self.links and self.links[u].alive for u in self.endpoints)

    def subset(self, urls: list[str]) -> ControlledEngines:
        """The same, restricted to ``urls``."""
        return ControlledEngines(self.engine.subset(urls), {u: k for u, k in self.links.items() if u in urls})

    async def collective_rpc(self, method: str, args: list[str] | None = None, kwargs: dict[str, str] | None = None,
                             timeout: float | None = None, *, version: str = "", reset: str = "",
                             pause_on_failure: bool = False) -> list[list[Any]]:
        """``method`` on every engine in rotation, as the HTTP client runs it (an engine out of rotation holds a
        ``down`` marker; none in rotation raises); over a link, ``version`` / ``reset`` / ``pause_on_failure`` are
        applied in the engine core in the same step gap (over HTTP they are ignored: the caller does them)."""
        urls = self.endpoints
        up = set(live_urls(self.engine))
        if not up:  # the HTTP client says why (NoEnginesError)
            return await self.engine.collective_rpc(method, args=args, kwargs=kwargs, timeout=timeout)
        ops = bool(version or reset or pause_on_failure)
        linked = [u for u in urls if u in up and u in self.links and self.links[u].alive] if not args else []
        by_url: dict[str, list[Any]] = {u: [_down(u)] for u in urls if u not in up}

        async def over_link(url: str) -> list[Any] | None:
            try:
                out = await self.links[url].call(method, kwargs or {}, version=version, reset=reset,
                                                  pause_on_failure=pause_on_failure, timeout_s=timeout or 30.0)
            except ControlLinkError as exc:
                log.warning("%s", exc)
                self.links.pop(url, None)
                return [failure(UPDATE_REFUSED, str(exc)) | {"link_failed": True}] if ops else None
            # the message's own label and reset (a worker's record may carry its own: the in-place copy's)
            extra = {k: True for k in ("version_set", "prefix_reset") if out.get(k)}
            extra |= {"control_queue_ms": out.get("queue_ms", 0.0), "control_core_ms": out.get("core_ms", 0.0)}
            return [w | extra if isinstance(w, dict) else w for w in out.get("workers") or []]

        for url, got in zip(linked, await asyncio.gather(*(over_link(u) for u in linked)), strict=True):
            if got is not None:
                by_url[url] = got
        http = [u for u in urls if u in up and u not in by_url]  # no link, or a broken one (sent again)
        if http:
            try:
                by_url.update(zip(http, await self.engine.subset(http).collective_rpc(
                    method, args=args, kwargs=kwargs, timeout=timeout), strict=True))
            except EngineError as exc:
                if len(http) == len(up):
                    raise
                for url in http:  # the others took it over their links: these leave the rotation, as over HTTP
                    self.engine.take_out(url, f"collective_rpc {method} failed: {exc}")
                    by_url[url] = [_down(url)]
        return [by_url[u] for u in urls]

    def close(self) -> None:
        """Close every link (idempotent)."""
        for link in self.links.values():
            link.close()


@contextlib.asynccontextmanager
async def controlled(engine: Any, urls: list[str] | None = None,
                     enabled: bool = True) -> AsyncIterator[ControlledEngines]:
    """``engine`` with control links to those of ``urls`` (default: all its endpoints; only engines on this
    host can be reached) that can open one; ``enabled`` False: HTTP for every one. The links close on exit."""
    links = await open_links(engine, list(engine.endpoints if urls is None else urls)) if enabled else {}
    wrapped = ControlledEngines(engine, links)
    try:
        yield wrapped
    finally:
        wrapped.close()
