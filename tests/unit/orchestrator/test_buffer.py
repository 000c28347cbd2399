"""The rollout buffer: admission bound, back-pressure, staleness drops, FIFO, close()."""

from __future__ import annotations

import asyncio
import random

import pytest

from agentrl.config.run import PipelineConfig
from agentrl.core.types import Trajectory
from agentrl.core.versions import PolicyVersion, group_oldest_version, oldest_version
from agentrl.orchestrator.buffer import BufferClosed, BufferCore, RolloutBuffer


def group(name: str, versions: list[int], size: int = 2) -> list[Trajectory]:
    """A GRPO group whose members carry the given per-token versions (-1: tool token)."""
    return [Trajectory(task_id=name, env="t", group_id=name, completion_ids=list(range(len(versions))),
                       loss_mask=[int(v >= 0) for v in versions], logprobs=[0.0] * len(versions),
                       versions=list(versions)) for _ in range(size)]


def cfg(b: int = 1, eta: int = 0, cap: int = 100, policy: str = "drop_stale") -> tuple[PipelineConfig, int]:
    return PipelineConfig(max_staleness=eta, capacity_groups=cap, drop_policy=policy), b


async def blocked(aw, timeout: float = 0.05) -> bool:
    """True if the awaitable is still pending after ``timeout`` (it is cancelled then)."""
    try:
        await asyncio.wait_for(aw, timeout)
    except asyncio.TimeoutError:
        return True
    return False


def test_oldest_version_ignores_non_model_tokens() -> None:
    assert oldest_version([-1, 5, -1, 3, 4]) == 3
    assert oldest_version([-1, -1]) is None
    assert group_oldest_version(group("g", [-1, 4, 6]) + group("h", [5, -1])) == 4


@pytest.mark.parametrize("b", [1, 2, 3])
@pytest.mark.parametrize("eta", [0, 1, 3])
def test_admission_bound_is_eta_plus_one_batches_ahead(b: int, eta: int) -> None:
    """At trainer version v with v·B groups consumed, exactly (η+1)·B more groups may start."""
    version = PolicyVersion()
    core: BufferCore[str] = BufferCore(*cfg(b, eta), version)
    for v in range(4):
        n = 0
        while core.can_admit():
            assert core.admit() == v
            n += 1
        assert n == ((eta + 1) * b if v == 0 else b)  # then each new version opens exactly one batch
        assert core.started == (v + eta + 1) * b
        for _ in range(b):  # FIFO, version-v tokens: the batch of step v
            core.complete("g", oldest=v)
        assert core.try_take(v) is not None
        assert not core.can_admit()  # consuming does not open slots; only a new version does
        version.bump()


async def test_eta0_is_synchronous() -> None:
    """η=0: producers may start only the current step's groups; the next ones wait for new weights."""
    version = PolicyVersion()
    buf = RolloutBuffer(*cfg(b=2, eta=0), version)
    assert [await buf.admit(), await buf.admit()] == [0, 0]
    assert await blocked(buf.admit())
    buf.put(group("a", [0, 0]))
    buf.put(group("b", [0, -1, 0]))
    assert len(await buf.get_batch(0)) == 2
    assert await blocked(buf.admit())  # trained but not yet published
    waiter = asyncio.create_task(buf.admit())
    await asyncio.sleep(0)
    version.bump()  # the owner's bump alone wakes the producer
    assert await asyncio.wait_for(waiter, 1) == 1
    assert buf.stats()["max_staleness_seen"] == 0


async def test_back_pressure_blocks_at_capacity_and_resumes_on_consume() -> None:
    buf = RolloutBuffer(*cfg(b=1, eta=10, cap=3))
    for _ in range(3):
        await buf.admit()
    assert await blocked(buf.admit())
    buf.put(group("a", [0]))
    assert await blocked(buf.admit())  # buffered groups still hold capacity
    waiter = asyncio.create_task(buf.admit())
    await asyncio.sleep(0)
    assert not waiter.done()
    await buf.get_batch(0)
    assert await asyncio.wait_for(waiter, 1) == 0
    assert buf.stats()["producer_wait_s"] > 0


async def test_release_frees_the_slot() -> None:
    buf = RolloutBuffer(*cfg(b=1, eta=0))
    v = await buf.admit()
    assert await blocked(buf.admit())
    buf.release(v)
    assert await buf.admit() == 0
    assert buf.stats()["released"] == 1
    with pytest.raises(RuntimeError):
        BufferCore(*cfg()).release()


async def test_stale_groups_are_dropped_and_counted_fifo_otherwise() -> None:
    version = PolicyVersion()
    buf = RolloutBuffer(*cfg(b=1, eta=1), version)
    slow, fast = await buf.admit(), await buf.admit()  # both at version 0
    buf.put(group("fast", [fast, fast]), fast)
    assert (await buf.get_batch(0))[0][0].task_id == "fast"
    version.bump()
    nxt = await buf.admit()
    buf.put(group("next", [nxt]), nxt)
    assert (await buf.get_batch(1))[0][0].task_id == "next"
    version.bump()
    buf.put(group("slow", [slow, -1, 2]), slow)  # partial rollout: oldest token is version 0
    assert await blocked(buf.get_batch(2))  # staleness 2 > η: dropped, never returned
    s = buf.stats()
    assert (s["dropped_stale"], s["consumed"], s["staleness_hist"]) == (1, 2, {0: 2})
    assert s["dropped_tokens"] == 2 * 2  # the two model tokens of each of its 2 members, not the tool token


async def straggler_behind(policy: str) -> tuple[RolloutBuffer, PolicyVersion, int]:
    """η = 1, B = 1: "slow" and "fast" admitted at version 0, "fast" trained, then "next" (admitted at version
    1) completed while "slow" is still in flight; returns the buffer, its version and "slow"'s admission."""
    version = PolicyVersion()
    buf = RolloutBuffer(*cfg(b=1, eta=1, policy=policy), version)
    slow, fast = await buf.admit(), await buf.admit()
    buf.put(group("fast", [fast]), fast)
    assert (await buf.get_batch(0))[0][0].task_id == "fast"
    version.bump()
    nxt = await buf.admit()
    buf.put(group("next", [1]), nxt)
    return buf, version, slow


async def test_block_policy_waits_for_the_straggler_instead_of_dropping() -> None:
    buf, _, slow = await straggler_behind("block")
    trainer = asyncio.create_task(buf.get_batch(1))
    await asyncio.sleep(0.01)
    assert not trainer.done()  # "slow" would be stale after this step: wait for it
    buf.put(group("slow", [0, 1]), slow)
    assert (await asyncio.wait_for(trainer, 1))[0][0].task_id == "slow"
    assert buf.stats()["dropped_stale"] == 0


async def test_accept_policy_trains_what_completed_without_waiting_or_dropping() -> None:
    buf, version, slow = await straggler_behind("accept")
    assert (await asyncio.wait_for(buf.get_batch(1), 1))[0][0].task_id == "next"  # no wait for "slow"
    version.bump()
    newer = await buf.admit()
    buf.put(group("newer", [2]), newer)
    buf.put(group("slow", [0, 1]), slow)  # completed last, admitted first: trained first, 2 versions old
    assert (await buf.get_batch(2))[0][0].task_id == "slow"
    s = buf.stats()
    assert (s["dropped_stale"], s["max_staleness_seen"], s["buffered"]) == (0, 2, 1)


async def test_fifo_order() -> None:
    version = PolicyVersion()
    buf = RolloutBuffer(*cfg(b=3, eta=1), version)
    names = list("abcdef")
    for n in names:
        buf.put(group(n, [0]), await buf.admit())
    first = await buf.get_batch(0)
    version.bump()
    second = await buf.get_batch(1)
    assert [g[0].task_id for g in first + second] == names


def test_unadmitted_put_evicts_oldest_at_capacity() -> None:
    version = PolicyVersion()
    core: BufferCore[str] = BufferCore(*cfg(b=1, cap=2), version)
    dropped: list[str] = []
    core.on_drop = dropped.append
    for name in "abc":
        core.complete(name, oldest=0)
    assert (core.dropped_capacity, [e[2] for e in core.queue]) == (1, ["b", "c"])
    version.advance(2)
    assert core.try_take(2) is None  # η = 0: both stale
    assert dropped == ["a", "b", "c"]  # every dropped item reaches on_drop, evicted or stale


async def test_close_unblocks_producers_and_trainer() -> None:
    buf = RolloutBuffer(*cfg(b=1, eta=0))
    await buf.admit()
    producer = asyncio.create_task(buf.admit())
    trainer = asyncio.create_task(buf.get_batch(0))
    await asyncio.sleep(0.01)
    buf.close()
    for task in (producer, trainer):
        with pytest.raises(BufferClosed):
            await asyncio.wait_for(task, 1)
    with pytest.raises(BufferClosed):
        buf.put(group("x", [0]))


@pytest.mark.parametrize("policy", ["drop_stale", "block", "accept"])
@pytest.mark.parametrize("seed", range(40))
def test_random_interleavings_never_exceed_eta(policy: str, seed: int) -> None:
    """Pure core, random admit/complete/release/train order: capacity and the admission bound hold; staleness
    ≤ η unless ``accept`` (which drops nothing instead)."""
    rng = random.Random(seed)
    b, eta = rng.randint(1, 4), rng.randint(0, 3)
    cap = rng.randint(b, 4 * b + 4)
    version = PolicyVersion()
    core: BufferCore[int] = BufferCore(*cfg(b, eta, cap, policy), version)
    flight: list[int] = []  # admission versions of groups in flight
    for _ in range(400):
        action = rng.random()
        if action < 0.35 and core.can_admit():
            flight.append(core.admit())
        elif action < 0.75 and flight:
            adm = flight.pop(rng.randrange(len(flight)))  # out-of-order completion
            first = rng.randint(adm, core.version)  # first token may come after a weight update
            core.complete(first, oldest=first, admitted_version=adm)
        elif action < 0.78 and flight:
            core.release(flight.pop(rng.randrange(len(flight))))
        else:
            batch = core.try_take(core.version)
            if batch is not None:
                assert policy == "accept" or all(core.version - first <= eta for first in batch)
                version.bump()
        assert core.in_flight + core.buffered <= cap
        assert core.started <= core.admission_limit()
        assert core.in_flight == len(flight)
    s = core.stats()
    if policy == "accept":
        assert s["dropped_stale"] == 0 and s["consumed"] + s["buffered"] + s["released"] + s["in_flight"] == s["admitted"]
        return
    assert s["max_staleness_seen"] <= eta
    assert all(k <= eta for k in s["staleness_hist"])
    if policy == "block":
        assert s["dropped_stale"] == 0


@pytest.mark.parametrize("seed", range(6))
async def test_async_producers_and_trainer_random_yields(seed: int) -> None:
    """Real asyncio producers and trainer with random scheduling: every batch is fresh, close() ends all."""
    rng = random.Random(seed)
    b, eta, steps = rng.randint(1, 3), rng.randint(0, 2), 12
    version = PolicyVersion()
    buf = RolloutBuffer(*cfg(b, eta, cap=3 * b + 1), version)
    seen: list[int] = []

    async def producer() -> None:
        while True:
            v = await buf.admit()
            for _ in range(rng.randint(0, 8)):
                await asyncio.sleep(0)
            buf.put(group("g", [v, -1, buf.core.version]), v)

    async def trainer() -> None:
        for v in range(steps):
            batch = await buf.get_batch(v)
            assert len(batch) == b
            seen.extend(v - group_oldest_version(g) for g in batch)
            for _ in range(rng.randint(0, 5)):
                await asyncio.sleep(0)
            version.advance(v + 1)

    producers = [asyncio.create_task(producer()) for _ in range(4)]
    await asyncio.wait_for(trainer(), 5)
    buf.close()
    results = await asyncio.gather(*producers, return_exceptions=True)
    assert all(isinstance(r, BufferClosed) for r in results)
    assert len(seen) == steps * b and max(seen) <= eta


def test_group_staleness_version_oldest_or_newest() -> None:
    from agentrl.core.types import Trajectory
    from agentrl.core.versions import group_staleness_version

    group = [Trajectory(task_id="t", env="e", versions=[-1, 3, 3, 4, -1, 5]),
             Trajectory(task_id="t", env="e", versions=[-1, 4])]
    assert group_staleness_version(group) == 3
    assert group_staleness_version(group, "newest") == 5
    assert group_staleness_version([Trajectory(task_id="t", env="e", versions=[-1, -1])], "newest") is None


def test_buffer_measures_staleness_from_the_configured_token() -> None:
    """With staleness_from = "newest", a group whose newest token is within η is trained where "oldest"
    drops it (the real buffer's put, drop_stale, η = 1, trainer at version 3)."""
    from agentrl.orchestrator.buffer import RolloutBuffer

    async def run(rule: str) -> tuple[list | None, int]:
        version = PolicyVersion()
        buf = RolloutBuffer(PipelineConfig(max_staleness=1, drop_policy="drop_stale", staleness_from=rule), 1,
                            version)
        adm = await buf.admit()
        version.advance(3)
        buf.put([Trajectory(task_id="t", env="e", versions=[0, 0, 2, 3])], adm)
        return buf.core.try_take(3), buf.core.dropped_stale

    assert asyncio.run(run("oldest")) == (None, 1)
    batch, dropped = asyncio.run(run("newest"))
    assert dropped == 0 and batch is not None and len(batch) == 1


def test_buffer_reads_the_one_policy_version_and_keeps_none_of_its_own() -> None:
    """The buffer holds its owner, not a copy: a bump (or a resume's restore) is seen without telling it."""
    version = PolicyVersion(5)  # a resumed run
    core: BufferCore[str] = BufferCore(*cfg(b=1, eta=0), version)
    assert (core.version, core.start_version, core.admit()) == (5, 5, 5)
    assert not core.can_admit()
    version.bump()
    assert core.version == 6 and core.stats()["version"] == 6 and core.can_admit()
    assert not hasattr(core, "set_version") and not hasattr(RolloutBuffer, "set_version")


async def test_a_bump_of_the_owner_wakes_waiting_producers_and_close_stops_watching() -> None:
    version = PolicyVersion()
    buf = RolloutBuffer(*cfg(b=1, eta=0), version)
    assert await buf.admit() == 0
    waiter = asyncio.create_task(buf.admit())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    version.bump()
    assert await asyncio.wait_for(waiter, 1) == 1
    buf.close()
    version.bump()  # a closed buffer no longer watches the version
    assert version._watchers == []
