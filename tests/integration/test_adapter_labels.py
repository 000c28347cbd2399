"""Weight labels per LoRA adapter on the real engine (:mod:`agentrl.engine.adapter_labels`): two adapters on one
engine, each synced in place with a version of its own; a sync of one relabels neither the other's tokens
(also those of a generation running through the sync) nor the base model's; an adapter reloaded from its file
forgets its label."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentrl.config.trainer import ALL_LINEAR
from agentrl.inference import InferenceClient
from agentrl.tools.bench.models import lora_shapes, random_lora, save_lora
from agentrl.weight_sync.shm import SharedMemoryAdapterSync
from tests.integration.conftest import tiny_model_config
from tests.integration.vllm_metrics import slowed_engine, streaming_past

pytestmark = pytest.mark.integration

POLICY, REF = "labels-policy", "labels-ref"
PROMPT = [(i * 13) % 390 + 5 for i in range(48)]


class _Trainer:
    def __init__(self, tensors: dict) -> None:
        self.tensors = tensors

    async def get_adapter_tensors(self) -> dict:
        return self.tensors


def _labels(gen: Any) -> list[str | None]:
    """The labels of ``gen``'s spans, in order (each once per span)."""
    assert gen.weight_versions, "the engine returned no weight-version spans"
    assert gen.weight_versions[-1][2] == len(gen.token_ids), gen.weight_versions
    return [label for label, _, _ in gen.weight_versions]


async def _greedy(client: InferenceClient, model: str | None, n: int = 6, on_tokens: Any = None) -> Any:
    return await client.generate(PROMPT, max_tokens=n, temperature=0.0, ignore_eos=True, stop_token_ids=[],
                                 model=model, on_tokens=on_tokens)


async def test_a_sync_of_one_adapter_leaves_the_other_adapters_label(vllm_server, tmp_path: Path) -> None:
    shapes = lora_shapes(tiny_model_config(), 16, tuple(ALL_LINEAR))
    policy, ref = _Trainer(random_lora(shapes, seed=80)), _Trainer(random_lora(shapes, seed=81))
    async with InferenceClient([vllm_server.url], timeout_s=300) as client:
        await client.load_lora_adapter(POLICY, str(save_lora(tmp_path / POLICY, policy.tensors)))
        await client.load_lora_adapter(REF, str(save_lora(tmp_path / REF, ref.tensors)))
        try:
            base = _labels(await _greedy(client, None))[-1]  # the engine-wide label, whatever ran before
            assert _labels(await _greedy(client, REF))[-1] == base  # never synced: the engine-wide label
            with SharedMemoryAdapterSync(policy, client, POLICY) as sync_policy, \
                    SharedMemoryAdapterSync(ref, client, REF) as sync_ref:
                policy.tensors = random_lora(shapes, seed=82)
                m = await sync_policy.publish(5)
                assert m["engine_ms"] > 0, m  # copied in place (no file load)
                assert _labels(await _greedy(client, POLICY)) == ["5"]
                assert _labels(await _greedy(client, REF)) == [base]
                assert _labels(await _greedy(client, None)) == [base]

                # ref synced to v1 while a policy generation runs through the sync
                n = 120
                ref.tensors = random_lora(shapes, seed=83)
                with slowed_engine():
                    running = await streaming_past(lambda on_tokens: _greedy(client, POLICY, n, on_tokens))
                    m = await sync_ref.publish(1)
                    assert not running.done(), "the policy generation ended before the sync: nothing was tested"
                    gen = await running
                assert m["engine_ms"] > 0, m  # copied in place (no file load)
                assert len(gen.token_ids) == n and _labels(gen) == ["5"], gen.weight_versions
                assert _labels(await _greedy(client, REF)) == ["1"]
                assert _labels(await _greedy(client, POLICY)) == ["5"]
                assert _labels(await _greedy(client, None)) == [base]

            # reloaded from its file, ref serves weights no sync labelled: the engine-wide label again
            await client.load_lora_adapter(REF, str(save_lora(tmp_path / f"{REF}-again", ref.tensors)))
            assert _labels(await _greedy(client, REF)) == [base]
            assert _labels(await _greedy(client, POLICY)) == ["5"]
        finally:
            for name in (POLICY, REF):
                await client.unload_lora_adapter(name)
