"""Reading the session vLLM server's Prometheus counters (to act while a generation is provably running)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from agentrl.inference import InferenceClient

STEP_DELAY_FLAG_ENV = "AGENTRL_TEST_STEP_DELAY_FLAG"
"""Names the flag file that slows the test engines' steps (``tests/integration/step_delay.py``); the integration
conftest sets it for the session, and the engines inherit it."""
STEP_DELAY_S = 0.02
"""The least duration of one engine step while the flag file exists."""
STEP_DELAY_ARGS = ["--logits-processors", "tests.integration.step_delay:StepDelay"]
"""vLLM server arguments that load the step-delay processor: every engine a test pauses mid-generation has them."""


@contextlib.contextmanager
def slowed_engine() -> Iterator[None]:
    """Every engine step started with ``STEP_DELAY_ARGS`` lasts at least ``STEP_DELAY_S`` inside the block."""
    flag = Path(os.environ[STEP_DELAY_FLAG_ENV])
    flag.touch()
    try:
        yield
    finally:
        flag.unlink(missing_ok=True)


async def generated_tokens(url: str) -> float:
    """The engine's running total of generated tokens (``vllm:generation_tokens_total``, summed over
    its label sets: the series are split by served model name)."""
    async with httpx.AsyncClient(timeout=10) as h:
        text = (await h.get(f"{url}/metrics")).text
    values = re.findall(r"^vllm:generation_tokens_total(?:\{[^}]*\})? ([0-9.e+]+)$", text, re.M)
    assert values, "vllm:generation_tokens_total missing from /metrics"
    return sum(float(v) for v in values)


class EngineOutran(AssertionError):
    """The generation finished within one resume -> pause round trip: was the engine started without
    ``STEP_DELAY_ARGS``?"""


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
            raise EngineOutran(f"the generation finished ({produced:.0f} of {total} tokens) in one resume -> "
                               "pause round trip; the engine outran the test (is it slowed: STEP_DELAY_ARGS?)")
        if produced >= first:
            return produced
        assert time.monotonic() < deadline, f"only {produced:.0f} tokens after {timeout_s:.0f} s"
        await client.resume()


async def start_paused_mid_generation(client: InferenceClient, url: str, request: Callable[[], Awaitable[Any]], *,
                                      first: int, total: int) -> asyncio.Task:
    """Start ``request()`` (a generation of ``total`` tokens) and return its task with the engine paused
    ("keep") after it produced at least ``first`` tokens and before it finished. The engine (started with
    ``STEP_DELAY_ARGS``) is slowed until the pause has landed, so the generation lasts at least
    ``total * STEP_DELAY_S`` seconds, far longer than a pause round trip even on a loaded machine; at full
    speed the engine core can finish a whole generation within one round trip. The caller resumes the engine.
    """
    with slowed_engine():
        start = await generated_tokens(url)
        running = asyncio.ensure_future(request())
        try:
            await pause_mid_generation(client, url, running, start, first=first, total=total)
        except BaseException:
            await client.resume()
            with contextlib.suppress(Exception):
                await running
            raise
    return running


async def streaming_past(request: Callable[[Callable[[list[int]], None]], Awaitable[Any]], first: int = 8) -> asyncio.Task:
    """Start ``request(on_tokens)`` (a streamed generation that hands its new ids to ``on_tokens``) and return
    its task once ``first`` tokens have arrived: a generation provably in flight, not paused. Slow the engine
    (:func:`slowed_engine`) for the generation to outlast what the caller does next."""
    seen: list[int] = []
    going = asyncio.Event()

    def on_tokens(ids: list[int]) -> None:
        seen.extend(ids)
        if len(seen) >= first:
            going.set()

    running = asyncio.ensure_future(request(on_tokens))
    waiting = asyncio.ensure_future(going.wait())
    await asyncio.wait({running, waiting}, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    if not going.is_set():
        raise EngineOutran(f"the generation ended after {len(seen)} tokens, before {first} arrived")
    return running
