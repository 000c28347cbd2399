"""The engines' LoRA slot follows the trainer's adapter rank; a slot that cannot hold it is refused when the
config loads, not at the engine's first load of the adapter."""

from __future__ import annotations

import pytest

from agentrl.config.inference import VLLMServerSettings, engine_lora_rank
from agentrl.config.run import load_config


def test_the_slot_is_the_smallest_engine_rank_that_holds_the_adapter() -> None:
    assert [engine_lora_rank(r) for r in (1, 2, 8, 9, 16, 17, 64, 300, 512)] == [1, 8, 8, 16, 16, 32, 64, 320, 512]
    for rank, slot in ((8, 16), (16, 16), (32, 32), (48, 64), (256, 256)):  # never under the default 16
        r = load_config(None, {"env": "calc", "trainer": {"lora_rank": rank}}).resolved()
        assert r.inference.max_lora_rank == slot and r.server_config().max_lora_rank == slot, rank


def test_a_slot_set_too_small_or_not_an_engine_size_is_refused_at_config_time() -> None:
    with pytest.raises(ValueError, match=r"does not fit the engines' LoRA slots .* raise it to 64"):
        load_config(None, {"env": "calc", "trainer": {"lora_rank": 64}, "inference": {"max_lora_rank": 32}})
    with pytest.raises(ValueError, match="vLLM reserves LoRA slots of rank 1, 8, 16"):
        VLLMServerSettings(max_lora_rank=20)
    with pytest.raises(ValueError, match="up to rank 512"):
        load_config(None, {"env": "calc", "trainer": {"lora_rank": 1024}})
    # set explicitly and large enough: kept; a full-weight run's engines serve no adapter, so no check
    big = load_config(None, {"env": "calc", "trainer": {"lora_rank": 8}, "inference": {"max_lora_rank": 64}})
    assert big.resolved().inference.max_lora_rank == 64
    load_config(None, {"env": "calc", "trainer": {"lora": False, "lora_rank": 64}, "inference": {"max_lora_rank": 8}})
