"""Racing one awaitable against an event: the shape of "this request, unless its engine leaves first"."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def unless_set(event: asyncio.Event, work: Awaitable[T]) -> asyncio.Future[T] | None:
    """Run ``work`` until it finishes or ``event`` is set, whichever comes first.

    Returns the finished task (read its ``result()``), or None when the event came first: then ``work`` has
    been cancelled and awaited, so nothing of it runs on. Cancelling the caller cancels ``work`` too.
    """
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            task = None
    return task
