"""Full-weight sync logic with fakes: the bucket plan, the double-buffered stream, and what happens to an
engine whose load fails (it leaves the rotation; the others go on, labelled with the new version)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrl.weight_sync.base import LOAD_FAILED
from agentrl.weight_sync.buckets import layout_bytes, payload_bytes, plan_buckets
from agentrl.weight_sync.full import FullWeightSync
from agentrl.weight_sync.inplace import SyncError

SPECS = [("embed", [10, 8]), ("l0.q", [8, 8]), ("l0.k", [8, 8]), ("l1.q", [8, 8]), ("norm", [8])]


def test_buckets_keep_model_order_bound_their_size_and_align_every_tensor() -> None:
    buckets = plan_buckets(SPECS, "float32", 600)
    assert [n for b in buckets for n, *_ in b] == [n for n, _ in SPECS]
    for b in buckets:
        assert all(off % 64 == 0 for *_, off in b)
        assert layout_bytes(b) <= 600 or len(b) == 1  # a tensor over the bound gets a bucket of its own
    assert payload_bytes(buckets) == 4 * (80 + 64 * 3 + 8)
    assert len(plan_buckets(SPECS, "bfloat16", 1 << 20)) == 1
    assert payload_bytes(plan_buckets(SPECS, "bfloat16", 1 << 20)) == 2 * (80 + 64 * 3 + 8)
    with pytest.raises(ValueError, match="dtype"):
        plan_buckets(SPECS, "int8", 600)


class Trainer:
    """Writes each bucket's index into its slot's first byte (what the engines read back)."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.writes: list[int] = []
        self.shm: Any = None

    async def weight_specs(self) -> list[tuple[str, list[int]]]:
        return SPECS

    async def write_weight_bucket(self, layout: list[Any], shm_name: str | None, segment_bytes: int,
                                  offset: int) -> dict[str, Any]:
        from multiprocessing import shared_memory

        i = len(self.writes)
        if i == self.fail_at:
            raise RuntimeError("trainer died")
        self.writes.append(offset)
        seg = shared_memory.SharedMemory(name=shm_name)
        seg.buf[offset] = i + 1
        seg.close()
        await asyncio.sleep(0)
        return {"written": True, "gather_ms": 1.0, "write_ms": 1.0}


class Engines:
    """Two engines: a record of every call, the bucket index each load read, and scripted failures."""

    def __init__(self, fail: dict[str, str] | None = None) -> None:
        self.urls = ["http://a", "http://b"]
        self.fail = fail or {}  # url -> method that fails there
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.loaded: dict[str, list[int]] = {u: [] for u in self.urls}
        self.down: dict[str, str] = {}
        self.only = self.urls

    @property
    def endpoints(self) -> list[str]:
        return list(self.only)

    def subset(self, urls: list[str]) -> Engines:
        sub = Engines.__new__(Engines)
        sub.__dict__ = self.__dict__.copy()
        sub.only = urls
        sub._root = getattr(self, "_root", self)
        return sub

    def _rec(self, what: str) -> None:
        root = getattr(self, "_root", self)
        root.calls.append((what, tuple(u for u in self.only if u not in root.down)))

    async def collective_rpc(self, method: str, args: Any = None, kwargs: dict[str, str] | None = None,
                             timeout: float | None = None) -> list[list[Any]]:
        from multiprocessing import shared_memory

        self._rec(method)
        out = []
        for url in self.only:
            if self.fail.get(url) == method:
                out.append([{"ok": False, "code": LOAD_FAILED, "error": "boom"}])
            elif method == "agentrl_weight_dtype":
                out.append([{"ok": True, "dtype": "float32"}])
            elif method == "agentrl_load_weights":
                seg = shared_memory.SharedMemory(name=kwargs["shm_name"])
                self.loaded[url].append(seg.buf[int(kwargs["offset"])])
                seg.close()
                out.append([{"ok": True, "engine_ms": 1.0}])
            else:
                out.append([{"ok": True}])
        return out

    async def pause(self, mode: str = "keep") -> None:
        self._rec(f"pause:{mode}")

    async def resume(self) -> None:
        self._rec("resume")

    async def set_weight_version(self, version: str) -> None:
        self._rec(f"version:{version}")

    async def reset_prefix_cache(self, running: bool = False) -> None:
        self._rec(f"reset:{running}")

    def take_out(self, url: str, reason: str) -> None:
        getattr(self, "_root", self).down[url] = reason


async def test_every_bucket_reaches_every_engine_in_order_through_alternating_slots() -> None:
    trainer, engines = Trainer(), Engines()
    with FullWeightSync(trainer, engines, bucket_bytes=300) as sync:
        out = await sync.publish(3)
        n = len(sync.buckets)
        slot = sync._slot
    assert n >= 3
    assert engines.loaded == {u: list(range(1, n + 1)) for u in engines.urls}
    assert trainer.writes == [(i % 2) * slot for i in range(n)]
    kinds = [c for c, _ in engines.calls]
    assert kinds[:3] == ["agentrl_weight_dtype", "pause:keep", "agentrl_begin_weights"]
    assert kinds[-4:] == ["agentrl_finish_weights", "version:3", "reset:True", "resume"]
    assert out["buckets"] == n and out["engines_failed"] == 0 and out["weight_bytes"] == payload_bytes(sync.buckets)


@pytest.mark.parametrize("method", ["agentrl_begin_weights", "agentrl_load_weights", "agentrl_finish_weights"])
async def test_an_engine_that_fails_its_load_leaves_the_rotation_and_the_others_go_on(method: str) -> None:
    engines = Engines(fail={"http://b": method})
    with FullWeightSync(Trainer(), engines, bucket_bytes=300) as sync:
        out = await sync.publish(1)
    assert list(engines.down) == ["http://b"] and "incomplete full-weight load" in engines.down["http://b"]
    assert out["engines_failed"] == 1
    tail = engines.calls[-4:]
    assert ("pause:abort", ("http://b",)) in engines.calls  # its frozen requests end and retry elsewhere
    assert tail[-3:] == [("version:1", ("http://a",)), ("reset:True", ("http://a",)), ("resume", ("http://a",))]


async def test_a_load_that_fails_everywhere_raises_with_every_engine_out() -> None:
    engines = Engines(fail={"http://a": "agentrl_load_weights", "http://b": "agentrl_load_weights"})
    with FullWeightSync(Trainer(), engines, bucket_bytes=300) as sync, pytest.raises(SyncError, match="every engine"):
        await sync.publish(1)
    assert sorted(engines.down) == engines.urls
    assert not any(c.startswith("version") or c == "resume" for c, _ in engines.calls)


async def test_a_trainer_failure_mid_stream_takes_every_engine_out() -> None:
    engines = Engines()
    with FullWeightSync(Trainer(fail_at=2), engines, bucket_bytes=300) as sync, pytest.raises(RuntimeError):
        await sync.publish(1)
    assert sorted(engines.down) == engines.urls


class NcclTrainer:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.sent: list[tuple[list[str], str]] = []

    async def nccl_send_weights(self, urls: list[str], master_address: str) -> dict[str, Any]:
        if self.fail:
            raise RuntimeError("NCCL broadcast failed")
        self.sent.append((urls, master_address))
        return {"nccl_send_ms": 5.0}


async def test_the_nccl_path_pauses_sends_then_labels_resets_and_resumes() -> None:
    from agentrl.weight_sync.nccl import NcclWeightSync

    trainer, engines = NcclTrainer(), Engines()
    out = await NcclWeightSync(trainer, engines, "10.0.0.1").publish(4)
    assert trainer.sent == [(engines.urls, "10.0.0.1")]
    assert [c for c, _ in engines.calls] == ["pause:keep", "version:4", "reset:True", "resume"]
    assert out["nccl_send_ms"] == 5.0 and out["engines_failed"] == 0


async def test_a_failed_nccl_transfer_takes_every_engine_out() -> None:
    from agentrl.weight_sync.nccl import NcclWeightSync

    engines = Engines()
    with pytest.raises(RuntimeError, match="NCCL"):
        await NcclWeightSync(NcclTrainer(fail=True), engines, "10.0.0.1").publish(4)
    assert sorted(engines.down) == engines.urls
    assert not any(c.startswith("version") or c == "resume" for c, _ in engines.calls)
