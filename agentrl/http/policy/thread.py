"""The policy endpoint on an event loop of its own, in a thread of the process that hosts it (a training run's
orchestrator).

The endpoint's own work (HTTP, request checks, rendering, stitching, parsing, streaming) then never waits
behind the orchestrator's (batching, checkpoints, metrics, plots), nor the orchestrator's behind it.
Generation still goes through the run's engine client on the orchestrator's loop: one set of connection
pools, one routing table and one view of which engines are in rotation. Episode bookkeeping that the run
does (creating an episode, closing it after its program exits) runs on the endpoint's loop, where the
episodes' locks live, through :meth:`EndpointThread.run`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import AsyncIterator, Coroutine
from typing import Any, Protocol, TypeVar

from agentrl.http.policy.service import PolicyService
from agentrl.inference.wire import Generation
from agentrl.rollout.generator import Generator

T = TypeVar("T")

STOP_TIMEOUT_S = 15.0
"""How long closing waits for the endpoint's thread (the server's graceful shutdown is 5 s of it)."""


class EndpointHost(Protocol):
    """Where the endpoint's episode bookkeeping runs."""

    async def run(self, coro: Coroutine[Any, Any, T]) -> T: ...


class SameLoop:
    """The endpoint serves on the caller's event loop: a coroutine runs where it is awaited."""

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return await coro


class LoopGenerator:
    """A :class:`~agentrl.rollout.generator.Generator` whose calls run on ``loop`` (the client's own), awaited
    from another loop; cancelling the caller cancels the call."""

    def __init__(self, client: Generator, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop

    async def generate(self, prompt_ids: list[int], **kw: Any) -> Generation:
        if (on_tokens := kw.get("on_tokens")) is not None:  # streamed ids reach the caller's loop, in order
            caller = asyncio.get_running_loop()
            kw["on_tokens"] = lambda ids: caller.call_soon_threadsafe(on_tokens, ids)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
            self.client.generate(prompt_ids, **kw), self.loop))

    def forget(self, key: str) -> None:
        """Release ``key``'s engine binding, on the client's loop."""
        if (forget := getattr(self.client, "forget", None)) is not None:
            self.loop.call_soon_threadsafe(forget, key)


class EndpointThread:
    """A thread running an event loop that serves one :class:`PolicyService` (see the module docstring)."""

    def __init__(self, service: PolicyService) -> None:
        self.service = service
        self.loop: asyncio.AbstractEventLoop | None = None
        self.url = ""
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the endpoint's loop and await its result from the caller's."""
        assert self.loop is not None, "the endpoint thread is not running"
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def _main(self, token: str, uds: str | None, ready: concurrent.futures.Future[str]) -> None:
        from agentrl.http.policy.run import serving

        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            async with serving(self.service, token, uds) as url:
                ready.set_result(url)
                await self._stop.wait()
        except BaseException as e:
            if not ready.done():
                ready.set_exception(e)
            raise

    @contextlib.asynccontextmanager
    async def serving(self, token: str, uds: str | None = None) -> AsyncIterator[str]:
        """Start the thread and its server (also on the Unix socket ``uds``, if given); yields the base URL once
        it accepts connections; stops both when the block ends."""
        ready: concurrent.futures.Future[str] = concurrent.futures.Future()

        def main() -> None:
            with contextlib.suppress(BaseException):  # a start-up failure reaches the caller through ``ready``
                asyncio.run(self._main(token, uds, ready))

        self._thread = threading.Thread(target=main, name="policy-endpoint", daemon=True)
        self._thread.start()
        try:
            self.url = await asyncio.wrap_future(ready)
            yield self.url
        finally:
            if self.loop is not None and self._stop is not None:
                with contextlib.suppress(RuntimeError):  # the loop has already closed
                    self.loop.call_soon_threadsafe(self._stop.set)
            await asyncio.to_thread(self._thread.join, STOP_TIMEOUT_S)
