"""The CPU LoRA fast path (patch 17, :mod:`agentrl.engine.cpu_lora`) on the real engine: adapters served from
vLLM's slots give the logprobs and greedy tokens of the same adapters merged into the base weights, one adapter
alone or several distinct ones (with a request of no adapter) in one batch, these served by agentrl's CPU LoRA
kernel where it is built; an in-place update of one slot is
served at once and leaves the others' outputs as they were, also for generations running through it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from agentrl.config.facts import cpu_build
from agentrl.config.trainer import ALL_LINEAR
from agentrl.engine import cpu_lora, native_lora
from agentrl.engine.cpu_lora import ENV_SWITCH
from agentrl.inference import InferenceClient
from agentrl.tools.bench.models import FixedAdapter, lora_shapes, random_lora, save_lora
from agentrl.weight_sync.merged import MergedAdapterSync
from agentrl.weight_sync.shm import SharedMemoryAdapterSync
from tests.conftest import require
from tests.integration.conftest import tiny_model_config

pytestmark = [pytest.mark.integration]

PROMPTS = [[(i * k) % 390 + 5 for i in range(40 + 9 * k)] for k in (7, 11, 13, 17)]
TOL = 1e-4  # float32: a slot adds (x A^T) B^T to x W^T where the merge multiplies by W + B A; both round at ~1e-7


def _shapes() -> dict:
    return lora_shapes(tiny_model_config(), 16, tuple(ALL_LINEAR))


def _gap(x: Any, y: Any) -> float:
    assert x.token_ids == y.token_ids, (x.token_ids, y.token_ids)
    return max(abs(a - b) for a, b in zip(x.logprobs, y.logprobs, strict=True))


async def _greedy(client: InferenceClient, prompt: list[int], model: str | None = None, n: int = 8) -> Any:
    return await client.generate(prompt, max_tokens=n, temperature=0.0, model=model)


@pytest.fixture(scope="module")
def engine(weights_engine: Any) -> Any:
    """The session server; the merges below replace its base weights (its own come back after the module)."""
    return weights_engine


def _paths() -> tuple[float, float]:
    """(``cpu_lora_fast``, ``cpu_lora_native``) an engine started by this session reports: on the CPU build the
    fast path (unless switched off), serving several slots with agentrl's kernel (make install builds it: its
    absence fails on CI); elsewhere vLLM's kernels."""
    fast = cpu_build() and os.environ.get(ENV_SWITCH, "1") != "0"
    if fast and native_lora.enabled():
        require(native_lora.kernel() is not None, "agentrl's CPU LoRA kernel is not built (make install builds it)")
    return float(fast), float(fast and native_lora.tile() > 0)


def _compiled() -> bool:
    """Whether this session's engine runs its model compiled with the LoRA layers in it (patch 22)."""
    return bool(_paths()[0]) and cpu_lora.compile_enabled()


async def _fast_path_on(client: InferenceClient) -> None:
    stats = (await client.collective_rpc("agentrl_lora_stats"))[0][0]
    fast, native = _paths()
    assert stats.get("cpu_lora_fast", 0.0) == fast and stats.get("cpu_lora_native", 0.0) == native, stats


@pytest.mark.parametrize("n_adapters", [1, 3])
async def test_slots_serve_what_the_merged_adapters_serve(engine, tmp_path: Path, n_adapters: int) -> None:
    trainers = [FixedAdapter(random_lora(_shapes(), seed=20 + i)) for i in range(n_adapters)]
    names = [f"fast-{n_adapters}-{i}" for i in range(n_adapters)]
    async with InferenceClient([engine.url], timeout_s=120) as client:
        await _fast_path_on(client)
        for name, t in zip(names, trainers, strict=True):
            await client.load_lora_adapter(name, str(save_lora(tmp_path / name, t.tensors)))
        try:
            # one batch: every adapter on its own prompt, and (with several) a request of no adapter beside them
            jobs = [_greedy(client, PROMPTS[i], name) for i, name in enumerate(names)]
            if n_adapters > 1:
                jobs.append(_greedy(client, PROMPTS[n_adapters]))
            served = await asyncio.gather(*jobs)
            stats = (await client.collective_rpc("agentrl_lora_stats"))[0][0]
            assert (stats["cpu_lora_compiled_calls"] > 0) == _compiled(), stats  # LoRA inside the compiled model
            base_alone = await _greedy(client, PROMPTS[n_adapters])
            gaps = []
            with MergedAdapterSync(trainers[0], client) as sync:
                for i, t in enumerate(trainers):
                    sync.trainer = t
                    await sync.publish(i + 1)
                    merged = await _greedy(client, PROMPTS[i])
                    gaps.append(_gap(served[i], merged))
                sync.trainer = FixedAdapter({n: x * 0 for n, x in trainers[0].tensors.items()})
                await sync.publish(n_adapters + 1)  # the base weights back
            if n_adapters > 1:  # the request of no adapter got nothing of the adapters beside it
                assert _gap(served[-1], base_alone) <= TOL
            assert max(gaps) <= TOL, gaps
        finally:
            for name in names:
                await client.unload_lora_adapter(name)


async def test_an_inplace_update_of_one_slot_leaves_the_others(engine, tmp_path: Path) -> None:
    """Three adapters generate; one is updated in place while the other two are mid-generation: the updated one
    serves its new weights at its next request (as a file load of them does), the others' generations are token
    for token what they are without the update."""
    trainers = [FixedAdapter(random_lora(_shapes(), seed=40 + i)) for i in range(3)]
    names = [f"inplace-{i}" for i in range(3)]
    long_n = 120
    async with InferenceClient([engine.url], timeout_s=300) as client:
        for name, t in zip(names, trainers, strict=True):
            await client.load_lora_adapter(name, str(save_lora(tmp_path / name, t.tensors)))
        try:
            alone = [await _greedy(client, PROMPTS[i + 1], names[i], long_n) for i in (1, 2)]
            new = random_lora(_shapes(), seed=99)
            await client.load_lora_adapter("inplace-ref", str(save_lora(tmp_path / "inplace-ref", new)))
            want_new = await _greedy(client, PROMPTS[0], "inplace-ref")
            await client.unload_lora_adapter("inplace-ref")
            with SharedMemoryAdapterSync(trainers[0], client, names[0]) as sync:
                running = [asyncio.create_task(_greedy(client, PROMPTS[i + 1], names[i], long_n)) for i in (1, 2)]
                await asyncio.sleep(0.3)
                trainers[0].tensors = new
                m = await sync.publish(1)
                assert m["engine_ms"] > 0, m
                got_new = await _greedy(client, PROMPTS[0], names[0])
                others = await asyncio.gather(*running)
            assert _gap(got_new, want_new) <= TOL
            for before, after in zip(alone, others, strict=True):
                assert _gap(before, after) <= TOL
        finally:
            for name in names:
                await client.unload_lora_adapter(name)


def test_bench_loop_serves_several_adapters_in_one_batch(engine, tiny_model_dir: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """``agentrl bench loop --adapter lora --adapters 1,3``: each count against the same base phases, the
    engine's path reported (no timing is asserted: the machine is shared)."""
    import json

    from agentrl.tools.bench.loop import main

    # three groups, one adapter each (the default spread): three distinct adapters in one batch
    assert main(["--adapter", "lora", "--adapters", "1,3", "--tasks", "3", "--group-size", "3", "--concurrency", "9",
                 "--repeats", "1", "--json", "--model", str(tiny_model_dir), "--endpoint", engine.url]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["adapters"] == [1, 3] and sorted(r["by_adapters"]) == ["1", "3"] and r["spread"] == "group"
    for n, row in r["by_adapters"].items():
        assert row["adapter_tokens_per_s"] > 0 and len(row["adapter_over_base_pairs"]) == 1
        assert row["target"] == (0.9 if n == "1" else 0.8)
        assert row["prefilled_tokens"] is not None and row["prefilled_tokens"] >= 0  # vLLM's counters, read
    assert r["base_prefilled_tokens"] is not None and r["base_prefilled_tokens"] >= 0
    assert r["adapter_over_base"] == r["by_adapters"]["1"]["adapter_over_base"]
    assert (r["cpu_lora_fast"], r["cpu_lora_native"]) == _paths()
