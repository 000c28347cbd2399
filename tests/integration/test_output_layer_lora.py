"""An adapter with a LoRA on the output layer (``trainer.lora_train_unembed``) served from vLLM's slots on the real
engine: the embedded model (Qwen2, whose class declares no output-layer LoRA: patch 21 adds it) serves the
logprobs that transformers + peft compute for the same adapter on the same tokens, the output layer's update
included (without it they differ by far more); an in-place update of such an adapter through shared memory is
served at once, as a load of the new weights from a file serves them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentrl.config.trainer import ALL_LINEAR
from agentrl.inference import InferenceClient
from agentrl.tools.bench.models import FixedAdapter, lora_shapes, random_lora, save_lora
from agentrl.weight_sync.shm import SharedMemoryAdapterSync
from tests.integration.conftest import tiny_model_config

pytestmark = [pytest.mark.integration]

PROMPTS = [[(i * k) % 390 + 5 for i in range(30 + 7 * k)] for k in (3, 5)]
SAME = 1e-4  # float32, one engine: a slot and a file load of the same weights
HF = 2e-3  # float32, vLLM's CPU kernels against transformers' sdpa forward on the same tokens


def _adapter(seed: int) -> dict:
    return random_lora(lora_shapes(tiny_model_config(), 16, tuple(ALL_LINEAR), output_layer=True), seed=seed)


def _hf_logprobs(model_dir: Path, adapter_dir: Path | None, prompt: list[int], completion: list[int]) -> list[float]:
    """transformers' (and peft's) log-probabilities of ``completion`` after ``prompt``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir))
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    rows = range(len(prompt) - 1, len(prompt) + len(completion) - 1)
    return [float(logp[r, t]) for r, t in zip(rows, completion, strict=True)]


def _gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


async def test_an_output_layer_lora_is_served_as_transformers_computes_it(vllm_server: Any, tiny_model_dir: Path,
                                                                        tmp_path: Path) -> None:
    tensors = _adapter(7)
    linear_only = {n: t for n, t in tensors.items() if "lm_head" not in n}
    with_head, without_head = save_lora(tmp_path / "head", tensors), save_lora(tmp_path / "nohead", linear_only)
    async with InferenceClient([vllm_server.url], timeout_s=120) as client:
        await client.load_lora_adapter("unembed", str(with_head))
        try:
            out = await client.generate(PROMPTS[0], max_tokens=12, temperature=0.0, model="unembed")
        finally:
            await client.unload_lora_adapter("unembed")
    want = _hf_logprobs(tiny_model_dir, with_head, PROMPTS[0], out.token_ids)
    assert _gap(out.logprobs, want) <= HF
    # the output layer's LoRA is in what was served: the same adapter without it scores the tokens otherwise
    assert _gap(out.logprobs, _hf_logprobs(tiny_model_dir, without_head, PROMPTS[0], out.token_ids)) > 20 * HF


async def test_an_inplace_update_reaches_the_output_layer(vllm_server: Any, tmp_path: Path) -> None:
    first, second = FixedAdapter(_adapter(11)), _adapter(12)
    async with InferenceClient([vllm_server.url], timeout_s=120) as client:
        await client.load_lora_adapter("unembed-ref", str(save_lora(tmp_path / "ref", second)))
        try:
            want = await client.generate(PROMPTS[1], max_tokens=10, temperature=0.0, model="unembed-ref")
        finally:
            await client.unload_lora_adapter("unembed-ref")
        await client.load_lora_adapter("unembed-live", str(save_lora(tmp_path / "live", first.tensors)))
        with SharedMemoryAdapterSync(first, client, "unembed-live") as sync:
            before = await client.generate(PROMPTS[1], max_tokens=10, temperature=0.0, model="unembed-live")
            first.tensors = second
            m = await sync.publish(1)
            assert m["engine_ms"] > 0 and "fallback" not in m, m  # in place, not from a file
            assert m["engine_copies"] == 1, m  # the output layer's slot laid out with the rest: one copy
            got = await client.generate(PROMPTS[1], max_tokens=10, temperature=0.0, model="unembed-live")
        await client.unload_lora_adapter("unembed-live")
    assert got.token_ids == want.token_ids and _gap(got.logprobs, want.logprobs) <= SAME
    assert before.logprobs != got.logprobs
