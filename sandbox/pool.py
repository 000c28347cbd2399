"""A warm pool of single-use sandboxes: ``async with pool.sandbox() as sb: ...`` in milliseconds.

Containers are pre-started in the background (up to ``size`` idle ones); each one is handed out ONCE and
destroyed on release, never reused across episodes. A semaphore bounds how many are checked out at once.
Engine errors are retried with backoff; an unreachable engine raises :class:`SandboxUnavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from ._engine import SandboxError, SandboxUnavailable, is_transient, make_client, to_thread
from .config import SandboxConfig, SandboxConfigError
from .docker_sandbox import DockerSandbox

log = logging.getLogger("agentrl.sandbox")


class SandboxPool:
    """Warm pool of :class:`DockerSandbox` (see module docstring). Use as an async context manager."""

    def __init__(self, config: SandboxConfig | None = None, *, size: int = 4, max_concurrency: int = 32,
                 max_idle_s: float = 600.0, refill_parallelism: int = 2, retries: int = 3,
                 backoff_s: float = 0.5) -> None:
        if size < 0 or max_concurrency < 1 or refill_parallelism < 1 or retries < 1:
            raise SandboxConfigError("size >= 0, max_concurrency >= 1, refill_parallelism >= 1, retries >= 1")
        self.config = config or SandboxConfig()
        self.size, self.max_idle_s, self.retries, self.backoff_s = size, max_idle_s, retries, backoff_s
        self.refill_parallelism = refill_parallelism
        self._sem = asyncio.Semaphore(max_concurrency)
        self._max_concurrency = max_concurrency
        self._warm: deque[DockerSandbox] = deque()
        self._need = asyncio.Event()
        self._changed = asyncio.Event()
        self._refill_task: asyncio.Task[None] | None = None
        self._client: Any = None
        self._closed = False
        self.last_error: BaseException | None = None
        self.stats = {"created": 0, "acquired_warm": 0, "acquired_cold": 0, "errors": 0}

    async def __aenter__(self) -> SandboxPool:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> SandboxPool:
        """Connect (raises :class:`SandboxUnavailable`), resolve the image (building the default one offline
        if needed) and start filling the pool in the background."""
        cfg = self.config
        self._client = await to_thread(make_client, cfg.docker_host, cfg.api_timeout_s,
                                       self._max_concurrency + self.size + 16)
        if not cfg.image:
            from .image import build_image

            image = await to_thread(build_image, client=self._client)
            self.config = cfg.model_copy(update={"image": image})
        self._refill_task = asyncio.create_task(self._refill_loop(), name="agentrl-sandbox-refill")
        self._need.set()
        return self

    @property
    def warm(self) -> int:
        """Number of idle, pre-started sandboxes."""
        return len(self._warm)

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until the pool holds ``size`` warm sandboxes (raises TimeoutError)."""
        async def full() -> None:
            while len(self._warm) < self.size:
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(full(), timeout)

    async def _create(self) -> DockerSandbox:
        """Start one sandbox, retrying transient engine errors with exponential backoff."""
        attempt = 0
        while True:  # ends with a started sandbox, or by raising the last attempt's error
            sb = DockerSandbox(self.config, client=self._client)
            try:
                await sb.start()
                self.stats["created"] += 1
                return sb
            except SandboxUnavailable:
                raise
            except SandboxError as e:
                self.stats["errors"] += 1
                self.last_error = e
                if attempt >= self.retries - 1 or not is_transient(e.__cause__ or e):
                    raise
                await asyncio.sleep(self.backoff_s * 2**attempt)
                attempt += 1

    def _fresh(self, sb: DockerSandbox) -> bool:
        now = time.time()
        return now - sb.started_at < self.max_idle_s and sb.expires_at - now > self.config.lifetime_s / 2

    async def acquire(self) -> DockerSandbox:
        """A started sandbox for one episode: a warm one if available, else a new one. Pair with
        :meth:`release` (or use :meth:`sandbox`)."""
        if self._closed or self._client is None:
            raise SandboxError("pool is not started (or closed)")
        await self._sem.acquire()
        try:
            while self._warm:
                sb = self._warm.popleft()
                if self._fresh(sb):
                    self.stats["acquired_warm"] += 1
                    return sb
                asyncio.create_task(sb.close())  # noqa: RUF006 (fire and forget; gc is the backstop)
            self.stats["acquired_cold"] += 1
            return await self._create()
        except BaseException:
            self._sem.release()
            raise
        finally:
            self._need.set()

    async def release(self, sb: DockerSandbox) -> None:
        """Destroy ``sb`` (sandboxes are never reused) and free its concurrency slot."""
        try:
            await sb.close()
        finally:
            self._sem.release()

    @contextlib.asynccontextmanager
    async def sandbox(self) -> AsyncIterator[DockerSandbox]:
        """``async with pool.sandbox() as sb:`` acquire, then always destroy."""
        sb = await self.acquire()
        try:
            yield sb
        finally:
            await asyncio.shield(self.release(sb))

    async def _refill_loop(self) -> None:
        delay = self.backoff_s
        while not self._closed:
            await self._need.wait()
            self._need.clear()
            while not self._closed and len(self._warm) < self.size:
                n = min(self.size - len(self._warm), self.refill_parallelism)
                results = await asyncio.gather(*(self._create() for _ in range(n)), return_exceptions=True)
                failed = False
                for r in results:
                    if isinstance(r, DockerSandbox):
                        if self._closed:
                            await r.close()
                        else:
                            self._warm.append(r)
                    else:
                        failed, self.last_error = True, r
                        log.warning("sandbox pool refill failed: %s", r)
                self._changed.set()
                if failed:  # engine trouble: back off (bounded), then try again
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 30.0)
                else:
                    delay = self.backoff_s

    async def close(self) -> None:
        """Stop refilling and destroy the idle sandboxes (checked-out ones are closed by their users)."""
        self._closed = True
        self._need.set()
        if self._refill_task is not None:  # let an in-flight batch finish (it closes what it made)
            try:
                await asyncio.wait_for(asyncio.shield(self._refill_task), 60)
            except (asyncio.TimeoutError, Exception):
                self._refill_task.cancel()
        warm, self._warm = list(self._warm), deque()
        await asyncio.gather(*(sb.close() for sb in warm), return_exceptions=True)
        if self._client is not None:
            await to_thread(self._client.close)
