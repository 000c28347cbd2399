"""Each model's requests run in seq_id order, a retry gets the first request's future, a gap fails the requests
behind it after its timeout and the model goes on."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.tinker.errors import TinkerUserError
from agentrl.tinker.futures import Future, Futures
from agentrl.tinker.sequencer import Sequencer


def _job(ran: list[int], seq: int, delay: float = 0.0):
    async def job(fut: Future) -> None:
        await asyncio.sleep(delay)
        ran.append(seq)
        Futures.succeed(fut, json={"seq": seq})
    return job


async def test_out_of_order_chunks_run_in_seq_id_order() -> None:
    futures, ran = Futures(), []
    seq = Sequencer(futures, "m")
    futs = {s: seq.submit(s, "o", "fb", _job(ran, s)) for s in (3, 2, 4)}
    await asyncio.sleep(0.05)
    assert ran == [] and not any(f.done.is_set() for f in futs.values())  # 1 has not arrived
    futs[1] = seq.submit(1, "o", "fb", _job(ran, 1))
    await asyncio.wait_for(futs[4].done.wait(), 5)
    assert ran == [1, 2, 3, 4] and [futs[s].json for s in (1, 2, 3, 4)] == [{"seq": s} for s in (1, 2, 3, 4)]


async def test_a_retry_is_not_run_twice_and_gets_the_first_future() -> None:
    futures, ran = Futures(), []
    seq = Sequencer(futures, "m")
    first = seq.submit(1, "o", "fb", _job(ran, 1, delay=0.05))
    again = seq.submit(1, "o", "fb", _job(ran, 1))
    assert again is first
    await asyncio.wait_for(first.done.wait(), 5)
    assert seq.submit(1, "o", "fb", _job(ran, 1)) is first  # after it ran, too
    await asyncio.sleep(0.05)
    assert ran == [1]


async def test_a_seq_id_below_the_next_one_and_never_seen_is_refused() -> None:
    seq = Sequencer(Futures(), "m", first_seq_id=5)
    with pytest.raises(TinkerUserError, match="seq_id 3 was used already"):
        seq.submit(3, "o", "fb", _job([], 3))
    with pytest.raises(TinkerUserError, match="seq_id is required"):
        seq.submit(None, "o", "fb", _job([], 0))


async def test_a_gap_fails_the_waiting_requests_and_the_model_goes_on() -> None:
    futures, ran = Futures(), []
    seq = Sequencer(futures, "m", gap_timeout_s=0.1)
    late = [seq.submit(s, "o", "fb", _job(ran, s)) for s in (2, 3)]
    await asyncio.wait_for(late[1].done.wait(), 5)
    assert ran == [] and all(f.category == "user" for f in late)
    assert "seq_id 1 never arrived" in (late[0].error or "") and "from seq_id 4" in (late[0].error or "")
    nxt = seq.submit(4, "o", "fb", _job(ran, 4))
    await asyncio.wait_for(nxt.done.wait(), 5)
    assert ran == [4] and nxt.error is None


async def test_a_failing_job_fails_its_future_and_the_next_request_runs() -> None:
    futures, ran = Futures(), []
    seq = Sequencer(futures, "m")

    async def boom(fut: Future) -> None:
        raise RuntimeError("broken")
    bad = seq.submit(1, "o", "fb", boom)
    good = seq.submit(2, "o", "fb", _job(ran, 2))
    await asyncio.wait_for(good.done.wait(), 5)
    assert bad.error == "RuntimeError: broken" and bad.category == "server" and ran == [2]
