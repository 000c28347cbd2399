"""Engine rotation: failed broadcasts and health checks take endpoints out; none left is noticed."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.inference.client import InferenceClient, InferenceError, NoEnginesError
from agentrl.inference.routing import EndpointPool
from agentrl.inference.watch import EngineWatch

DEAD = "http://127.0.0.1:9"  # nothing listens on the discard port


def test_pool_skips_endpoints_out_of_rotation() -> None:
    pool = EndpointPool(["http://a", "http://b"])
    assert pool.pick("k").url == "http://a"
    assert pool.mark_down("http://a", "dead") and not pool.mark_down("http://a", "dead")
    assert pool.pick("k").url == "http://b", "a sticky key moves off a dead endpoint"
    pool.mark_down("http://b", "dead")
    with pytest.raises(RuntimeError, match="out of rotation"):
        pool.pick()
    pool.mark_up("http://a")
    assert pool.pick().url == "http://a"


async def test_failed_broadcast_drops_only_the_failing_endpoint() -> None:
    async with InferenceClient([DEAD, "http://127.0.0.1:8"], timeout_s=2, max_retries=1) as client:
        with pytest.raises(Exception, match="failed"):  # every endpoint failed: that is an error
            await client.set_weight_version("3")
        client.pool.mark_down(DEAD, "test")
        client.pool.mark_down("http://127.0.0.1:8", "test")
        with pytest.raises(NoEnginesError):
            await client.set_weight_version("3")


async def test_a_broadcast_that_finds_the_last_engine_gone_says_none_is_left() -> None:
    """A run's only engine killed: its weight update is refused, so the run learns that no engine is left
    (and stops with a checkpoint) instead of failing on one call."""
    async with InferenceClient([DEAD], timeout_s=2, max_retries=1) as client:
        with pytest.raises(NoEnginesError, match="no inference engine accepts connections"):
            await client.collective_rpc("agentrl_update", kwargs={"x": "1"})
        assert not client.pool.live and "collective_rpc agentrl_update" in str(client.pool.endpoints[0].down)


async def test_a_refused_engine_with_another_in_rotation_is_not_none_left() -> None:
    """Only a subset of the engines (those of one sync path) gone while another is in rotation: the
    failure is the caller's to handle, not a run without engines."""
    async with InferenceClient([DEAD, "http://127.0.0.1:8"], timeout_s=2, max_retries=1) as client:
        with pytest.raises(InferenceError) as info:
            await client.set_weight_version("3", only=[DEAD])
        assert not isinstance(info.value, NoEnginesError)
        assert len(client.pool.live) == 2


async def test_watch_drops_an_unresponsive_engine_and_notices_none_is_left() -> None:
    async with InferenceClient([DEAD], timeout_s=2) as client:
        calls = []

        async def republish(url: str, version: int) -> None:
            calls.append((url, version))

        watch = EngineWatch(client, republish, lambda: 7, failures_to_drop=2, lost_after_s=0.0,
                            health_timeout_s=1.0)
        await watch.check()
        assert client.pool.live and not watch.lost.is_set(), "one missed health check is not enough"
        await watch.check()
        assert not client.pool.live and client.pool.endpoints[0].down == "health check failed"
        await watch.check()
        assert watch.lost.is_set()
        assert calls == [], "an engine that does not answer is never republished to"


async def test_an_update_that_finds_no_engine_waits_until_one_is_back_at_the_trainers_version() -> None:
    """The last engine was out of rotation when a weight update ran: the update waits for it to answer again;
    it comes back with the version the trainer's weights have (``version()``), once, whoever brings it back."""
    async with InferenceClient([DEAD], timeout_s=2) as client:
        client.pool.mark_down(DEAD, "health check failed")
        healthy, calls = {DEAD: False}, []

        async def health(urls: list[str], timeout_s: float) -> dict[str, bool]:
            return {u: healthy[u] for u in urls}

        async def republish(url: str, version: int) -> None:
            calls.append((url, version))

        client.health = health  # type: ignore[method-assign]
        watch = EngineWatch(client, republish, lambda: 8, interval_s=0.01, lost_after_s=60.0)
        waiting = asyncio.ensure_future(watch.wait_back())
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await watch.check()  # a health round while the update waits
        healthy[DEAD] = True
        await watch.check()
        assert await asyncio.wait_for(waiting, 5) == [DEAD]
        assert calls == [(DEAD, 8)] and client.pool.live
