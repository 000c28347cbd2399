"""A run's MoE decisions: which LoRA sync path, and routing capture turned on (or the run refused)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agentrl.config.run import RunConfig
from agentrl.moe.families import MoEInfo
from agentrl.orchestrator.moe import model_moe, plan_moe, routing_template

INFO = MoEInfo(family="qwen3_moe", experts=8, top_k=2, layers=4, moe_layers=(0, 1, 2, 3), norm_topk_prob=True)


def _cfg(**kw) -> RunConfig:
    return RunConfig(env="calc", model="m", **kw)


def test_model_moe_reads_the_config(tmp_path: Path) -> None:
    assert model_moe(str(tmp_path / "missing")) is None
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", "num_experts": 8,
                                                      "num_experts_per_tok": 2, "num_hidden_layers": 2}))
    info = model_moe(str(tmp_path))
    assert info is not None and (info.experts, info.top_k, info.layers) == (8, 2, 2)


def test_lora_on_moe_merges_on_the_cpu_build(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentrl.inference import server

    monkeypatch.setattr(server, "_is_cpu_build", lambda: True)
    cfg = plan_moe(_cfg(), INFO).resolved()
    assert cfg.pipeline.lora_sync == "merged" and not cfg.inference.enable_lora and not cfg.serves_adapter
    assert cfg.policy_model == cfg.inference.served_model_name
    # as a run plans it: from its resolved config, whose engines were to serve LoRA; the plan resolves again
    planned = plan_moe(_cfg().resolved(), INFO)
    assert planned.is_frozen and planned.pipeline.lora_sync == "merged" and not planned.inference.enable_lora
    assert plan_moe(_cfg(), None).pipeline.lora_sync == "adapter"  # dense
    monkeypatch.setattr(server, "_is_cpu_build", lambda: False)
    assert plan_moe(_cfg(), INFO).pipeline.lora_sync == "adapter"  # GPU engines serve LoRA on MoE
    forced = _cfg(pipeline={"lora_sync": "merged"})
    assert plan_moe(forced, None).pipeline.lora_sync == "merged"  # any engine without LoRA, by choice


@pytest.mark.parametrize("whole", ["lora_train_norms", "lora_train_embedding"])
def test_an_adapter_with_tensors_trained_whole_is_served_merged(whole: str) -> None:
    """``trainer.lora_train_norms``, ``trainer.lora_train_embedding``: vLLM's LoRA slots hold neither norms nor
    an embedding, so ``auto`` merges (dense model, any build), ``adapter`` is refused, and full weights have
    nothing to add."""
    flag = {whole: True}
    cfg = plan_moe(_cfg(trainer=flag), None).resolved()
    assert cfg.pipeline.lora_sync == "merged" and not cfg.serves_adapter and not cfg.inference.enable_lora
    with pytest.raises(ValueError, match=r"vLLM's LoRA slots hold none: serve the policy merged .* or set them to "
                                         r"false for adapter sync"):
        _cfg(trainer=flag, pipeline={"lora_sync": "adapter"})
    with pytest.raises(ValueError, match=rf"trainer.{whole} .* full-weight training .* trains them already"):
        _cfg(trainer={**flag, "lora": False})


def test_black_box_agents_of_moe_models_are_planned_as_the_own_loop() -> None:
    """The policy endpoint's rows carry routing: a black-box agent of a MoE model gets the same plan."""
    agent = {"command": ["python", "agent.py"]}
    for replay in (True, False):
        own = plan_moe(_cfg(trainer={"routing_replay": replay}), INFO)
        assert plan_moe(_cfg(agent=agent, trainer={"routing_replay": replay}), INFO).pipeline == own.pipeline
    assert plan_moe(_cfg(agent=agent), None).pipeline == plan_moe(_cfg(), None).pipeline  # dense


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
