"""The sampler's adapter registry: the least recently used adapter is unloaded beyond ``max_registered`` and
loaded again from its directory when it is sampled; the SDK's ``stop`` maps to vLLM's fields; vLLM's prompt
logprobs map to the prompt tokens'."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from agentrl.tinker.sampler import SlotSampler, _prompt_logprobs, _stop_fields


class FakeEngine:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def load_lora_adapter(self, name: str, path: str, inplace: bool = True) -> float:
        self.calls.append(("load", name))
        return 0.001

    async def unload_lora_adapter(self, name: str, missing_ok: bool = True) -> None:
        self.calls.append(("unload", name))

    async def aclose(self) -> None:
        pass


@pytest.fixture
def sampler() -> SlotSampler:
    s = SlotSampler(SimpleNamespace(url="http://127.0.0.1:9"), max_adapters=1, max_rank=8,  # type: ignore[arg-type]
                    max_registered=2)
    s._client = FakeEngine()  # type: ignore[assignment]
    return s


async def test_the_least_recently_used_adapter_is_unloaded_and_loaded_again(sampler: SlotSampler,
                                                                             tmp_path: Path) -> None:
    engine = sampler._client
    await sampler.publish("a", tmp_path / "a")
    await sampler.publish("b", tmp_path / "b")
    assert await sampler._ensure("a") == "a"  # a is now the most recently used
    await sampler.publish("c", tmp_path / "c")  # b goes
    assert engine.calls == [("load", "a"), ("load", "b"), ("unload", "b"), ("load", "c")]
    assert await sampler._ensure("b") == "b"  # loaded again from its directory; a goes
    assert engine.calls[-2:] == [("unload", "a"), ("load", "b")]
    assert await sampler._ensure(None) == "base"
    await sampler.publish("c", tmp_path / "c")  # already there: nothing to do
    assert engine.calls[-1] == ("load", "b")


def test_the_sdks_stop_as_vllm_fields() -> None:
    assert _stop_fields(None) == {}
    assert _stop_fields([]) == {"ignore_eos": True}
    assert _stop_fields("\n\n") == {"stop": ["\n\n"]}
    assert _stop_fields([2, 7]) == {"stop_token_ids": [2, 7]}
    assert _stop_fields(["a", "b"]) == {"stop": ["a", "b"]}


def test_prompt_logprobs_are_the_prompt_tokens_and_the_top_k() -> None:
    raw = [None, {"token_id:5": {"logprob": -0.5}, "token_id:9": {"logprob": -1.5}},
           {"7": {"logprob": -2.0}, "3": {"logprob": -0.1}}]
    lps, tops = _prompt_logprobs([1, 9, 7], raw, k=1)
    assert lps == [None, -1.5, -2.0]
    assert tops == [None, [(5, -0.5)], [(3, -0.1)]]


async def test_an_update_waits_for_running_samples_and_holds_new_ones() -> None:
    from agentrl.tinker.sampler import _Gate

    gate, events = _Gate(), []

    async def sample(tag: str, hold: float) -> None:
        async with gate.read():
            events.append(f"{tag} start")
            await asyncio.sleep(hold)
            events.append(f"{tag} end")

    async def update() -> None:
        async with gate.write():
            events.append("update")

    first = asyncio.create_task(sample("a", 0.05))
    await asyncio.sleep(0.01)
    writer = asyncio.create_task(update())
    await asyncio.sleep(0.01)
    late = asyncio.create_task(sample("b", 0.0))
    await asyncio.gather(first, writer, late)
    assert events == ["a start", "a end", "update", "b start", "b end"]


def test_sampling_options_not_served_are_refused() -> None:
    from agentrl.tinker.errors import TinkerUserError
    from agentrl.tinker.sampling import _check_served

    plain = SimpleNamespace(topk_sample_logprobs=0, target_prompt_logprobs=None, prompt_alt_tokens_k=0,
                            record_stability_info=None)
    _check_served(plain)
    with pytest.raises(TinkerUserError, match="topk_sample_logprobs, prompt_alt_tokens_k: not served"):
        _check_served(SimpleNamespace(**{**vars(plain), "topk_sample_logprobs": 3, "prompt_alt_tokens_k": 2}))
