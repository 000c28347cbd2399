"""Seeded sampling on the CPU build, on real engines: a seeded request whose prefill is split between engine
steps (its prompt longer than a step's token budget) once killed vLLM's CPU engine core (``RuntimeError: CPU
Generator does not use offset``, then ``EngineDeadError`` for every client). agentrl's patch 15 rewinds the
generator exactly, so the seeded stream does not depend on how the prefill was split either."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.inference import InferenceClient, VLLMServer, VLLMServerConfig
from tests.conftest import require

pytestmark = pytest.mark.integration

BUDGET = 128
"""The chunking engine's token budget per step: every prompt below is split into three prefill chunks."""
PROMPTS = [[(i * 7 + j * 29) % 390 + 5 for i in range(300)] for j in range(4)]


@pytest.fixture(scope="module")
def chunking_engine(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """The embedded model served with a step budget smaller than every prompt here (the session engine's
    budget, 2048 tokens, splits none of them)."""
    require(importlib.util.find_spec("vllm") is not None, "vLLM is not installed")
    cfg = VLLMServerConfig(model=str(tiny_model_dir), dtype="float32", max_model_len=1024, startup_timeout_s=300,
                           extra_args=["--max-num-batched-tokens", str(BUDGET)])
    with VLLMServer(cfg, tmp_path_factory.mktemp("chunking-engine-logs")) as server:
        yield server


async def _sample(url: str, n_concurrent: int = 1) -> list[tuple[list[int], list[float]]]:
    async with InferenceClient([url], timeout_s=120) as c:
        gens = await asyncio.gather(*(c.generate(PROMPTS[j % len(PROMPTS)], max_tokens=8, temperature=1.0,
                                                 seed=j, ignore_eos=True) for j in range(n_concurrent)))
        assert await c.health() == {url: True}
    return [(g.token_ids, g.logprobs) for g in gens]


async def test_seeded_requests_survive_split_prefills_and_sample_as_unsplit(chunking_engine, vllm_server) -> None:
    split = await _sample(chunking_engine.url, n_concurrent=32)  # each prefill split; many at once
    assert all(len(ids) == 8 for ids, _ in split)
    whole = await _sample(vllm_server.url, n_concurrent=len(PROMPTS))  # the same requests, prefills whole
    # Same seeds, same prompts: the same tokens (the logits differ only by float rounding between a split and
    # a whole prefill). Without the exact rewind the discarded draws would shift every split request's stream.
    for (ids, lps), (ref_ids, ref_lps) in zip(split[:len(PROMPTS)], whole, strict=True):
        assert ids == ref_ids
        assert lps == pytest.approx(ref_lps, abs=1e-4)
