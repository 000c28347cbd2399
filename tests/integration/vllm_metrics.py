"""Reading the session vLLM server's Prometheus counters (to act while a generation is provably running)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from agentrl.inference import InferenceClient


async def generated_tokens(url: str) -> float:
    """The engine's running total of generated tokens (``vllm:generation_tokens_total``, summed over
    its label sets: the series are split by served model name)."""
    async with httpx.AsyncClient(timeout=10) as h:
        text = (await h.get(f"{url}/metrics")).text
    values = re.findall(r"^vllm:generation_tokens_total(?:\{[^}]*\})? ([0-9.e+]+)$", text, re.M)
    assert values, "vllm:generation_tokens_total missing from /metrics"
    return sum(float(v) for v in values)


class EngineOutran(AssertionError):
    """The generation finished within one resume -> pause round trip (a loaded machine stalled the pause)."""


async def pause_mid_generation(client: InferenceClient, url: str, running: asyncio.Task, start: float, *, first: int, total: int,
                               timeout_s: float = 120) -> float:
    """Freeze the engine (pause "keep") while ``running`` has produced at least ``first`` but fewer than
    ``total`` tokens, and return how many it has produced.

    The engine is paused *before* its counter is read, so a fast engine cannot run ahead between the
    observation and the pause: the only stretch it runs unobserved is one resume -> pause round trip.
    The counter is read until it is steady, because the API server may still be delivering outputs that
    the engine made before it paused. The caller resumes the engine.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        await asyncio.sleep(0.005)
        await client.pause("keep")
        produced = await generated_tokens(url) - start
        while (again := await generated_tokens(url) - start) != produced:
            produced = again
        if running.done() or produced >= total:
            raise EngineOutran(f"the generation finished ({produced:.0f} of {total} tokens) in one "
                                 "resume -> pause round trip; the engine outran the test")
        if produced >= first:
            return produced
        assert time.monotonic() < deadline, f"only {produced:.0f} tokens after {timeout_s:.0f} s"
        await client.resume()


async def start_paused_mid_generation(client: InferenceClient, url: str, request: Callable[[], Awaitable[Any]], *,
                                      first: int, total: int, attempts: int = 5) -> asyncio.Task:
    """Start ``request()`` (a generation of ``total`` tokens) and return its task with the engine paused
    ("keep") after it produced at least ``first`` tokens and before it finished. A generation that ran to
    its end inside one resume -> pause round trip did not test anything: it is started again,
    ``attempts`` times at most. (The engine core can run far ahead of the API server, which counts the
    tokens and answers the pause; on a loaded machine one round trip can outlast a whole generation.)
    The caller resumes the engine."""
    for attempt in range(1, attempts + 1):
        start = await generated_tokens(url)
        running = asyncio.ensure_future(request())
        try:
            await pause_mid_generation(client, url, running, start, first=first, total=total)
            return running
        except EngineOutran:
            await client.resume()
            await running
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")
