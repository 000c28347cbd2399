"""A dead engine leaves the rotation without failing requests or weight updates, and a restarted one rejoins
only after it received the current adapter and version (two real vLLM servers)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from agentrl.bench.models import lora_shapes, random_lora, save_lora
from agentrl.inference import InferenceClient, VLLMServer
from agentrl.inference.watch import EngineWatch
from agentrl.weight_sync.route import adapter_publisher

pytestmark = pytest.mark.integration

NAME = "fault-policy"
PROMPT = [(i * 11) % 390 + 5 for i in range(40)]


class _Trainer:
    def __init__(self, tensors: dict) -> None:
        self.tensors = tensors

    async def get_adapter_tensors(self) -> dict:
        return self.tensors

    async def save_adapter(self, path: Path) -> dict:
        save_lora(path, self.tensors)
        return {"bytes": 0}


async def _greedy(client: InferenceClient, key: str | None = None):
    return await client.generate(PROMPT, max_tokens=4, temperature=0.0, model=NAME, key=key)


async def test_dead_engine_leaves_and_rejoins_with_the_current_weights(vllm_server, tmp_path: Path) -> None:
    second = VLLMServer(vllm_server.cfg.model_copy(update={"port": 0}), tmp_path / "second")
    second.start()
    try:
        shapes = lora_shapes("tiny", 16)
        trainer = _Trainer(random_lora(shapes, seed=21))
        urls = [vllm_server.url, second.url]
        async with InferenceClient(urls, timeout_s=60, max_retries=4) as client, \
                adapter_publisher("shm", trainer, client, NAME, tmp_path / "adapters") as pub:
            await pub.publish(1)
            assert {(await _greedy(client, key=f"k{i}")).weight_versions[-1][0] for i in range(4)} == {"1"}

            os.killpg(second.pgid, signal.SIGKILL)  # the engine dies with requests still to come
            second.proc.wait(30)
            gens = [await _greedy(client, key=f"after{i}") for i in range(6)]
            assert all(g.token_ids for g in gens), "requests fail over to the engine that is left"
            down = {e.url: e.down for e in client.pool.endpoints}
            assert down[vllm_server.url] is None and down[second.url], down

            trainer.tensors = random_lora(shapes, seed=22)
            await pub.publish(2)  # the weight update goes on without the dead engine
            reference = await _greedy(client)
            assert reference.weight_versions[-1][0] == "2"

            async def republish(url: str, version: int) -> None:
                async with InferenceClient([url], timeout_s=60) as one, \
                        adapter_publisher("shm", trainer, one, NAME, tmp_path / "rejoin") as p:
                    await p.publish(version)

            watch = EngineWatch(client, republish, lambda: 2)
            assert await watch.rejoin(2) == [], "a dead engine does not rejoin"
            restarted = VLLMServer(vllm_server.cfg.model_copy(update={"port": second.port}), tmp_path / "third")
            restarted.start()
            try:
                assert await watch.rejoin(2) == [second.url]
                assert all(e.down is None for e in client.pool.endpoints)
                async with InferenceClient([second.url], timeout_s=60) as direct:
                    again = await _greedy(direct)
                assert again.weight_versions[-1][0] == "2", "the rejoined engine serves the current version"
                assert again.token_ids == reference.token_ids
                assert max(abs(a - b) for a, b in zip(again.logprobs, reference.logprobs, strict=True)) < 1e-4
            finally:
                restarted.stop()
    finally:
        second.stop()
