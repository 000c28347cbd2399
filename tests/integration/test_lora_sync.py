"""In-place LoRA sync over shared memory against the session vLLM server (worker extension on by default)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentrl.config.trainer import ALL_LINEAR
from agentrl.inference import InferenceClient, VLLMServerConfig
from agentrl.tools.bench.models import ATTENTION, lora_shapes, random_lora, save_lora
from agentrl.weight_sync.inplace import SyncError
from agentrl.weight_sync.shm import SharedMemoryAdapterSync
from tests.integration.conftest import tiny_model_config

pytestmark = pytest.mark.integration

NAME = "shm-policy"
LONG_PROMPT = [(i * 7) % 390 + 5 for i in range(300)]  # several KV blocks: a stale prefix cache would show



class _Trainer:
    def __init__(self, tensors: dict) -> None:
        self.tensors = tensors

    async def get_adapter_tensors(self) -> dict:
        return self.tensors


async def _greedy(client: InferenceClient, name: str = NAME):
    return await client.generate(LONG_PROMPT, max_tokens=6, temperature=0.0, model=name)


def _close(x, y, tol: float = 1e-4) -> bool:
    return x.token_ids == y.token_ids and max(abs(a - b) for a, b in zip(x.logprobs, y.logprobs, strict=True)) <= tol


def test_extension_left_out_when_unimportable(tmp_path: Path) -> None:
    from agentrl.inference.server import VLLMServer

    bad = VLLMServerConfig(model="org/model", worker_extension="agentrl.no_such_module.Ext")
    assert "--worker-extension-cls" not in VLLMServer(bad, tmp_path).build_command()
    missing = VLLMServerConfig(model="org/model", worker_extension="agentrl.engine.extension.NoSuchClass")
    assert "--worker-extension-cls" not in VLLMServer(missing, tmp_path).build_command()
    good = VLLMServer(VLLMServerConfig(model="org/model"), tmp_path).build_command()
    assert good[good.index("--worker-extension-cls") + 1] == "agentrl.engine.extension.WorkerExtension"
    with pytest.raises(ValueError, match=r"old name, which is gone: use agentrl\.engine\.extension\.WorkerExtension"):
        VLLMServerConfig(model="org/model", worker_extension="agentrl.inference.lora_ext.LoRAInPlaceExtension")


@pytest.mark.parametrize(("targets", "alphas", "b_scale", "rank"),
                         [(ATTENTION, None, None, 16), (tuple(ALL_LINEAR), None, None, 16),
                          (tuple(ALL_LINEAR), {"down_proj": 8, "q_proj": 64}, None, 16),
                          (tuple(ALL_LINEAR), None, 2.0, 16), (tuple(ALL_LINEAR), None, None, 8)],
                         ids=["attention", "every-linear", "per-module-alpha", "b-sent-scaled", "padded-slot"])
async def test_inplace_update_matches_file_load(vllm_server, tmp_path: Path, targets: tuple[str, ...],
                                                alphas: dict[str, float] | None, b_scale: float | None,
                                                rank: int) -> None:
    """Every module kind the adapter can touch, the engine's packed ones included (q/k/v into qkv_proj, gate/up
    into gate_up_proj, and the MLP's down_proj), modules scaled differently (peft's ``alpha_pattern``), B
    sent already scaled (a run's publisher, ``b_scale`` = alpha / r = 32 / 16), and an adapter of a lower rank
    than the engine's slots (copied tensor by tensor: its slot is not one block): the in-place copy serves what
    a file load of the same tensors serves."""
    shapes = lora_shapes(tiny_model_config(), rank, targets)
    trainer = _Trainer(random_lora(shapes, seed=0))
    async with InferenceClient([vllm_server.url], timeout_s=120) as client:
        await client.load_lora_adapter(NAME, str(save_lora(tmp_path / "v0", trainer.tensors, rank=rank,
                                                           alpha_pattern=alphas)))
        v0 = await _greedy(client)  # fills the prefix cache with KV computed under v0
        with SharedMemoryAdapterSync(trainer, client, NAME, b_scale=b_scale) as sync:
            for version, seed in ((1, 1), (2, 2)):
                trainer.tensors = random_lora(shapes, seed=seed)
                m = await sync.publish(version)
                assert m["engine_ms"] > 0 and m["prefix_reset_ok"] != 0.0
                # rank 16 in slots of 16, float32: the slots are laid out as the segment, one copy writes them
                assert m["engine_copies"] == (1.0 if rank == 16 else float(len(shapes))), m
                inplace = await _greedy(client)
                assert inplace.weight_versions and inplace.weight_versions[-1][0] == str(version)
                sums = (await client.collective_rpc("agentrl_lora_checksum", kwargs={"adapter": NAME}))[0][0]
                assert sums["slot"] is not None and sums["cached"] == pytest.approx(sums["live"], rel=1e-6)
                file = save_lora(tmp_path / f"file{version}", trainer.tensors, rank=rank, alpha_pattern=alphas)
                await client.load_lora_adapter(NAME, str(file))
                from_file = await _greedy(client)
                assert _close(inplace, from_file), (inplace, from_file)
                assert not _close(inplace, v0, tol=1e-3)
            shm_path = Path("/dev/shm") / str(sync.shm_name)
            assert shm_path.exists()
        assert not shm_path.exists()  # unlinked on close
        await client.unload_lora_adapter(NAME)


async def test_b_sent_scaled_otherwise_than_a_module_is_refused(vllm_server, tmp_path: Path) -> None:
    """An adapter that scales its modules differently (``alpha_pattern``) cannot take B pre-scaled by one
    factor: the engine names the module and keeps its weights; the update goes through the fallback."""
    shapes = lora_shapes(tiny_model_config(), 16, tuple(ALL_LINEAR))
    trainer = _Trainer(random_lora(shapes, seed=4))
    async with InferenceClient([vllm_server.url], timeout_s=120) as client:
        await client.load_lora_adapter(NAME, str(save_lora(tmp_path / "v0", trainer.tensors,
                                                           alpha_pattern={"down_proj": 8})))
        before = await _greedy(client)
        trainer.tensors = random_lora(shapes, seed=5)
        with SharedMemoryAdapterSync(trainer, client, NAME, b_scale=2.0) as sync:
            with pytest.raises(SyncError, match=r"down_proj.*scaled by 2\.0.*scales this module by 0\.5"):
                await sync.publish(1)
        assert _close(await _greedy(client), before)  # nothing was half-written
        await client.unload_lora_adapter(NAME)


async def test_unknown_adapter_is_refused(vllm_server, tmp_path: Path) -> None:
    trainer = _Trainer(random_lora(lora_shapes("tiny", 16), seed=3))
    async with InferenceClient([vllm_server.url], timeout_s=60) as client:
        sync = SharedMemoryAdapterSync(trainer, client, "never-loaded")
        try:
            with pytest.raises(SyncError, match="never loaded"):
                await sync.publish(1)
        finally:
            name = sync.shm_name
            sync.close()
        assert name and not os.path.exists(f"/dev/shm/{name}")


class _FileTrainer(_Trainer):
    """Also saves its adapter's files, as the trainer does when an engine has no slot yet."""

    async def save_adapter(self, path: Path) -> dict:
        save_lora(path, self.tensors)
        return {"bytes": sum(p.stat().st_size for p in Path(path).iterdir())}


async def test_network_path_creates_the_slot_and_updates_in_place(vllm_server, tmp_path: Path) -> None:
    """Forced to the network (no shared memory, no shared files): the adapter's files travel in the request
    to create the slot, later versions are copied in place from the request body, and each gives the same
    greedy tokens and logprobs as a file load of the same tensors."""
    from agentrl.weight_sync.network import NetworkAdapterSync

    name = "net-policy"
    shapes = lora_shapes("tiny", 16)
    trainer = _FileTrainer(random_lora(shapes, seed=10))
    async with InferenceClient([vllm_server.url], timeout_s=120) as client:
        sync = NetworkAdapterSync(trainer, client, name, tmp_path / "net")
        m = await sync.publish(1)
        assert m["network_slots_created"] == 1.0, m  # the engine had no slot: files sent in the call
        first = await _greedy(client, name)
        assert first.weight_versions and first.weight_versions[-1][0] == "1"
        for version, seed in ((2, 11), (3, 12)):
            trainer.tensors = random_lora(shapes, seed=seed)
            m = await sync.publish(version)
            assert m["network_slots_created"] == 0.0 and m["network_engine_ms"] > 0, m
            assert m["network_payload_bytes"] > m["adapter_bytes"]  # base64
            inplace = await _greedy(client, name)
            assert inplace.weight_versions[-1][0] == str(version)
            sums = (await client.collective_rpc("agentrl_lora_checksum", kwargs={"adapter": name}))[0][0]
            assert sums["slot"] is not None and sums["cached"] == pytest.approx(sums["live"], rel=1e-6)
            await client.load_lora_adapter(name, str(save_lora(tmp_path / f"file{version}", trainer.tensors)))
            from_file = await _greedy(client, name)
            assert _close(inplace, from_file), (inplace, from_file)
            assert not _close(inplace, first, tol=1e-3)
        await client.unload_lora_adapter(name)


async def test_the_probe_routes_a_local_engine_to_shared_memory(vllm_server, tmp_path: Path) -> None:
    from agentrl.config.sync import ShmSync
    from agentrl.weight_sync.base import PublishTarget
    from agentrl.weight_sync.hosts import engines_on_this_host
    from agentrl.weight_sync.registry import open_publisher
    from agentrl.weight_sync.shm import SharedMemoryAdapterSync

    async with InferenceClient([vllm_server.url], timeout_s=60) as client:
        assert await engines_on_this_host(client) == {vllm_server.url: True}
        trainer = _FileTrainer(random_lora(lora_shapes("tiny", 16), seed=4))
        target = PublishTarget(trainer, client, adapter_name="probe-policy", adapter_dir=tmp_path)
        async with open_publisher(ShmSync(), target) as pub:
            assert isinstance(pub, SharedMemoryAdapterSync)
            assert pub.atomic  # its syncs go over the engine core's control socket
        async with open_publisher(ShmSync(control="http"), target) as pub:
            assert isinstance(pub, SharedMemoryAdapterSync) and not pub.atomic
        assert not list(Path("/dev/shm").glob("agentrl_probe_*")), "the probe's segment is unlinked"


async def test_an_evaluated_adapter_is_published_into_its_slot(vllm_server, tiny_model_dir: Path,
                                                             tmp_path: Path) -> None:
    """``agentrl eval --adapter``: a saved adapter with no tensor trained whole is served from a LoRA slot
    (the transport a run that trained it settles on, ``shm``: its first publish loads the files), and the
    evaluation samples from that slot, which then serves the file's weights."""
    from agentrl.config.run import load_config
    from agentrl.orchestrator.evaluate import run_eval

    tensors = random_lora(lora_shapes("tiny", 16), seed=9)
    adapter = save_lora(tmp_path / "adapter", tensors)
    cfg = load_config(None, {"env": "calc", "model": str(tiny_model_dir), "endpoints": [vllm_server.url],
                             "output_dir": str(tmp_path), "adapter_name": "eval-policy"})
    result = await run_eval(cfg, adapter=adapter, n=2)
    assert result["num_tasks"] == 2 and result["adapter"] == str(adapter), result
    async with InferenceClient([vllm_server.url], timeout_s=60) as client:
        try:
            served = await _greedy(client, "eval-policy")
            await client.load_lora_adapter("eval-file", str(adapter))
            assert _close(served, await _greedy(client, "eval-file"))
        finally:
            for name in ("eval-policy", "eval-file"):
                await client.unload_lora_adapter(name)


async def test_over_the_control_socket_the_copy_serves_what_a_file_load_serves(vllm_server, tmp_path: Path) -> None:
    """Every linear layer with modules scaled differently, each version one message on the engine core's
    control socket (copy, label, reset between two steps): a file load of the same tensors serves the same; a
    generation running across an update is not paused, and its tokens split once between the versions with
    the prefix kept."""
    from agentrl.core.versions import token_versions
    from agentrl.weight_sync.control import controlled
    from tests.integration.vllm_metrics import slowed_engine, streaming_past

    alphas = {"down_proj": 8, "q_proj": 64}
    shapes = lora_shapes(tiny_model_config(), 16, tuple(ALL_LINEAR))
    trainer = _Trainer(random_lora(shapes, seed=50))
    async with InferenceClient([vllm_server.url], timeout_s=300) as client, controlled(client) as fast:
        assert fast.atomic
        await client.load_lora_adapter(NAME, str(save_lora(tmp_path / "v0", trainer.tensors, alpha_pattern=alphas)))
        with SharedMemoryAdapterSync(trainer, fast, NAME) as sync:
            for version, seed in ((1, 51), (2, 52)):
                trainer.tensors = random_lora(shapes, seed=seed)
                m = await sync.publish(version)
                assert m["engines_control"] == 1 and m["prefix_reset_ok"] == 1.0 and m["engine_ms"] > 0, m
                assert m["engine_copies"] == 1.0, m
                inplace = await _greedy(client)
                assert inplace.weight_versions and inplace.weight_versions[-1][0] == str(version)
                await client.load_lora_adapter(NAME, str(save_lora(tmp_path / f"f{version}", trainer.tensors,
                                                                   alpha_pattern=alphas)))
                assert _close(inplace, await _greedy(client))
            await sync.publish(3)  # the file load replaced the adapter: a new slot plan, then the in-flight test
            n = 200

            async def greedy(on_tokens: object = None) -> object:
                return await client.generate(LONG_PROMPT[:32], max_tokens=n, temperature=0.0, ignore_eos=True,
                                             stop_token_ids=[], model=NAME, on_tokens=on_tokens)

            ref = await greedy()
            trainer.tensors = random_lora(shapes, seed=53)
            with slowed_engine():
                running = await streaming_past(greedy)
                await sync.publish(4)
            gen = await running
        versions = token_versions(gen, -1)
        assert 4 in versions, gen.weight_versions
        k = versions.index(4)
        assert 8 <= k < n and versions == [3] * k + [4] * (n - k), gen.weight_versions
        assert gen.token_ids[:k] == ref.token_ids[:k] and gen.token_ids != ref.token_ids
        await client.unload_lora_adapter(NAME)


async def test_an_adapter_evicted_from_its_slot_comes_back_with_its_last_update(vllm_server, tmp_path: Path) -> None:
    """An in-place update writes the live slot only; the adapter's CPU copy (which vLLM refills a slot from)
    follows when vLLM releases the slot. Updated, then pushed out of the engine's slots by as many other
    adapters as it has slots, the adapter serves its last update again, not the weights it was loaded with."""
    shapes = lora_shapes(tiny_model_config(), 16, tuple(ALL_LINEAR))
    trainer = _Trainer(random_lora(shapes, seed=60))
    slots = 4  # the session engine's max_loras (its CPU holds 8 adapters: ours stays there)
    async with InferenceClient([vllm_server.url], timeout_s=120) as client:
        await client.load_lora_adapter(NAME, str(save_lora(tmp_path / "v0", trainer.tensors)))
        loaded = await _greedy(client)
        with SharedMemoryAdapterSync(trainer, client, NAME) as sync:
            trainer.tensors = random_lora(shapes, seed=61)
            await sync.publish(1)
            updated = await _greedy(client)
        assert not _close(updated, loaded, tol=1e-3)
        others = [f"evictor-{i}" for i in range(slots)]
        for i, name in enumerate(others):
            await client.load_lora_adapter(name, str(save_lora(tmp_path / name, random_lora(shapes, seed=70 + i))))
            await _greedy(client, name)  # takes a slot: the least recently used one goes, ours first
        try:
            assert _close(await _greedy(client), updated), "refilled from a CPU copy that missed the update"
        finally:
            for name in [*others, NAME]:
                await client.unload_lora_adapter(name)
