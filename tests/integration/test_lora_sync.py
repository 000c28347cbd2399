"""In-place LoRA sync over shared memory against the session vLLM server (worker extension on by default)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentrl.bench.models import lora_shapes, random_lora, save_lora
from agentrl.inference import InferenceClient, VLLMServerConfig
from agentrl.sync_shm import SharedMemoryAdapterSync, SyncError

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
    missing = VLLMServerConfig(model="org/model", worker_extension="agentrl.inference.lora_ext.NoSuchClass")
    assert "--worker-extension-cls" not in VLLMServer(missing, tmp_path).build_command()
    good = VLLMServer(VLLMServerConfig(model="org/model"), tmp_path).build_command()
    assert good[good.index("--worker-extension-cls") + 1] == "agentrl.inference.lora_ext.LoRAInPlaceExtension"


async def test_inplace_update_matches_file_load(vllm_server, tmp_path: Path) -> None:
    shapes = lora_shapes("tiny", 16)
    trainer = _Trainer(random_lora(shapes, seed=0))
    async with InferenceClient([vllm_server.url], timeout_s=120) as client:
        await client.load_lora_adapter(NAME, str(save_lora(tmp_path / "v0", trainer.tensors)))
        v0 = await _greedy(client)  # fills the prefix cache with KV computed under v0
        with SharedMemoryAdapterSync(trainer, client, NAME) as sync:
            for version, seed in ((1, 1), (2, 2)):
                trainer.tensors = random_lora(shapes, seed=seed)
                m = await sync.publish(version)
                assert m["engine_ms"] > 0 and m["prefix_reset_ok"] != 0.0
                inplace = await _greedy(client)
                assert inplace.weight_versions and inplace.weight_versions[-1][0] == str(version)
                sums = (await client.collective_rpc("agentrl_lora_checksum", kwargs={"adapter": NAME}))[0][0]
                assert sums["slot"] is not None and sums["cached"] == pytest.approx(sums["live"], rel=1e-6)
                await client.load_lora_adapter(NAME, str(save_lora(tmp_path / f"file{version}", trainer.tensors)))
                from_file = await _greedy(client)
                assert _close(inplace, from_file), (inplace, from_file)
                assert not _close(inplace, v0, tol=1e-3)
            shm_path = Path("/dev/shm") / str(sync.shm_name)
            assert shm_path.exists()
        assert not shm_path.exists()  # unlinked on close
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
