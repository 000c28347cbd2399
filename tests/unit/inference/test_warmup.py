"""The engine warm-up burst: request shapes, and failures that are counted but never stop a run."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrl.inference import InferenceError
from agentrl.inference.warmup import warm_up, warmup_requests


def test_requests_spread_prompt_and_generation_lengths() -> None:
    reqs = warmup_requests(64, vocab_size=50, max_prompt_tokens=200, max_tokens=32, seed=3)
    assert len(reqs) == 64
    lengths = sorted(len(ids) for ids, _ in reqs)
    gens = sorted(m for _, m in reqs)
    assert lengths[0] == 8 and lengths[-1] == 200 and len(set(lengths)) > 50
    assert gens[0] == 1 and gens[-1] == 32  # decode batches shrink through every size
    assert all(0 <= t < 50 for ids, _ in reqs for t in ids)
    assert reqs == warmup_requests(64, vocab_size=50, max_prompt_tokens=200, max_tokens=32, seed=3)
    assert warmup_requests(1, vocab_size=5, max_prompt_tokens=4, max_tokens=1)[0][1] == 1
    assert len(warmup_requests(1, vocab_size=5, max_prompt_tokens=4, max_tokens=1)[0][0]) == 4
    with pytest.raises(ValueError, match=">= 1"):
        warmup_requests(0, vocab_size=5, max_prompt_tokens=4, max_tokens=1)


class _Client:
    def __init__(self, fail_every: int = 0, error: type[BaseException] = InferenceError) -> None:
        self.calls: list[tuple[int, int, str]] = []
        self.fail_every = fail_every
        self.error = error

    async def generate(self, ids: list[int], *, max_tokens: int, model: str, **_: Any) -> str:
        self.calls.append((len(ids), max_tokens, model))
        n = len(self.calls)
        await asyncio.sleep(0)
        if self.fail_every and n % self.fail_every == 0:
            raise self.error("engine said no")
        return "ok"


async def test_burst_runs_at_the_given_concurrency_on_the_model() -> None:
    client = _Client()
    rec = await warm_up(client, model="policy", concurrency=16, vocab_size=10)  # type: ignore[arg-type]
    assert len(client.calls) == 16 and {m for _, _, m in client.calls} == {"policy"}
    assert rec["warmup_failed"] == 0 and rec["warmup_s"] >= 0


async def test_engine_failures_are_counted_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    client = _Client(fail_every=4)
    rec = await warm_up(client, model="policy", concurrency=16, vocab_size=10)  # type: ignore[arg-type]
    assert rec["warmup_failed"] == 4
    assert "4 of 16 requests failed" in caplog.text and "engine said no" in caplog.text


async def test_programming_errors_are_raised() -> None:
    with pytest.raises(TypeError, match="engine said no"):
        await warm_up(_Client(fail_every=2, error=TypeError), model="p", concurrency=4, vocab_size=10)  # type: ignore[arg-type]
