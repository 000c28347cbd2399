"""A run's MoE routing capture turned on (or the run refused). Which transport a MoE model's engines need is
settled with the config: ``tests/unit/config/test_sync.py``."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.moe.families import MoEInfo
from agentrl.orchestrator.moe import routing_template

INFO = MoEInfo(family="qwen3_moe", experts=8, top_k=2, layers=4, moe_layers=(0, 1, 2, 3), norm_topk_prob=True)


class _Engines:
    def __init__(self, recs: dict) -> None:
        self.recs, self.resets = recs, 0

    async def enable_routing_capture(self) -> dict:
        return self.recs

    async def reset_prefix_cache(self) -> None:
        self.resets += 1


def test_routing_template_and_refusals() -> None:
    ok = {"ok": True, "layers": 4, "top_k": 2, "experts": 8, "moe_layers": [0, 1, 2, 3], "dtype": "uint8",
          "new": True}
    engines = _Engines({"u": ok})
    routing = asyncio.run(routing_template(engines, INFO, replay=True))
    assert routing is not None and (routing.layers, routing.top_k, routing.n) == (4, 2, 0)
    assert engines.resets == 1  # blocks cached before capture have no routing
    assert asyncio.run(routing_template(_Engines({"u": ok}), None, replay=True)) is None
    bad = _Engines({"u": {"ok": False, "error": "no router"}})
    with pytest.raises(RuntimeError, match=r"routing capture is unavailable.*routing_replay = false"):
        asyncio.run(routing_template(bad, INFO, replay=True))
    assert asyncio.run(routing_template(bad, INFO, replay=False)) is None
    with pytest.raises(RuntimeError, match="not the same model"):
        asyncio.run(routing_template(_Engines({"u": {**ok, "layers": 6}}), INFO, replay=True))
