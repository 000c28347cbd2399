"""``unless_set``: the work, unless the event comes first."""

from __future__ import annotations

import asyncio

from agentrl.core.utils.race import unless_set


async def test_the_work_that_finishes_first_is_returned_done() -> None:
    done = await unless_set(asyncio.Event(), asyncio.sleep(0, result=7))
    assert done is not None and done.result() == 7


async def test_an_event_first_cancels_the_work_and_awaits_it() -> None:
    event, cleaned = asyncio.Event(), []

    async def work() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            cleaned.append(True)

    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await unless_set(event, work()) is None
    assert cleaned == [True]


async def test_the_works_error_is_the_callers() -> None:
    async def fail() -> None:
        raise KeyError("x")

    done = await unless_set(asyncio.Event(), fail())
    assert done is not None and isinstance(done.exception(), KeyError)
