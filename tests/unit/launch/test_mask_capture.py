"""A run with truncated sampling turns on every engine's sampling-mask capture, or stops with one sentence: an
engine that cannot record the kept sets, or a top-k that keeps the whole vocabulary. Untruncated sampling
asks the engines nothing."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from agentrl.config.run import RunConfig
from agentrl.launch.stack import MaskCaptureUnavailable, enable_sampling_masks


class _Engines:
    def __init__(self, recs: dict[str, dict[str, Any]]) -> None:
        self.recs, self.calls = recs, 0

    async def enable_mask_capture(self) -> dict[str, dict[str, Any]]:
        self.calls += 1
        return self.recs


def _stack(recs: dict[str, dict[str, Any]]) -> Any:
    return SimpleNamespace(client=_Engines(recs))


async def test_truncated_sampling_turns_capture_on_everywhere() -> None:
    stack = _stack({"http://a": {"ok": True}, "http://b": {"ok": True}})
    await enable_sampling_masks(stack, RunConfig(sampling={"top_p": 0.9}), vocab=1000)
    assert stack.client.calls == 1


async def test_untruncated_sampling_asks_nothing() -> None:
    stack = _stack({})
    await enable_sampling_masks(stack, RunConfig(), vocab=1000)
    assert stack.client.calls == 0


async def test_an_engine_that_cannot_capture_stops_the_run() -> None:
    stack = _stack({"http://a": {"ok": True}, "http://b": {"ok": False, "error": "reports raw_logprobs"}})
    with pytest.raises(MaskCaptureUnavailable, match=r"http://b: reports raw_logprobs"):
        await enable_sampling_masks(stack, RunConfig(sampling={"min_p": 0.05}), vocab=1000)


async def test_a_top_k_over_the_vocabulary_is_refused() -> None:
    stack = _stack({"http://a": {"ok": True}})
    with pytest.raises(MaskCaptureUnavailable, match="not below the model's vocabulary of 953"):
        await enable_sampling_masks(stack, RunConfig(sampling={"top_k": 953}), vocab=953)
    assert stack.client.calls == 0
