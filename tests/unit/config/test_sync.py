"""The weight-sync transport of a run: one config class per transport under ``pipeline.weight_sync``, the rule
of which may serve what (:func:`agentrl.config.sync.refusal`), and ``auto`` settled once, at resolution."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import tomllib

from agentrl.config import facts
from agentrl.config.errors import ConfigValidationError, SettingError
from agentrl.config.run import RunConfig, load_config
from agentrl.config.sync import AutoSync, MergedSync, Served, ShmSync, refusal, settle
from agentrl.moe.families import MoEInfo

INFO = MoEInfo(family="qwen3_moe", experts=8, top_k=2, layers=4, moe_layers=(0, 1, 2, 3), norm_topk_prob=True)


def _cfg(**kw) -> RunConfig:
    return RunConfig(env="calc", model="m", **kw)


def _moe(monkeypatch: pytest.MonkeyPatch, *, cpu: bool) -> None:
    monkeypatch.setattr(facts, "model_moe", lambda model: INFO)
    monkeypatch.setattr(facts, "cpu_build", lambda: cpu)


def test_model_moe_reads_the_config(tmp_path: Path) -> None:
    assert facts.model_moe(str(tmp_path / "missing")) is None
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", "num_experts": 8,
                                                      "num_experts_per_tok": 2, "num_hidden_layers": 2}))
    info = facts.model_moe(str(tmp_path))
    assert info is not None and (info.experts, info.top_k, info.layers) == (8, 2, 2)


def test_a_bare_name_is_the_transport_with_its_defaults() -> None:
    assert _cfg(pipeline={"weight_sync": "merged"}).transport == MergedSync()
    table = _cfg(pipeline={"weight_sync": {"transport": "merged", "carrier": "network", "control": "http"}})
    assert table.transport == MergedSync(carrier="network", control="http")
    assert _cfg().transport == AutoSync()
    with pytest.raises(ConfigValidationError, match="does not match any of the expected tags: 'shm', 'network'"):
        load_config(None, {"env": "calc", "pipeline": {"weight_sync": "ipc"}})
    with pytest.raises(ConfigValidationError, match="control"):  # not a setting of the network transport
        load_config(None, {"env": "calc", "pipeline": {"weight_sync": {"transport": "network", "control": "http"}}})


def test_auto_settles_once_at_resolution_and_prints_what_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dense model, plain adapter: the LoRA slots, through shared memory (or the call body); the TOML that
    ``--print-config`` writes reloads to the same transport, which resolves to itself."""
    plain = _cfg()
    r = plain.resolved()
    assert r.transport == ShmSync() and r.serves_adapter and r.inference.enable_lora
    assert r.policy_model == plain.adapter_name
    net = _cfg(pipeline={"weight_sync": {"transport": "auto", "carrier": "network"}}).resolved()
    assert net.transport.transport == "network"
    printed = tomllib.loads(r.to_toml())["pipeline"]["weight_sync"]
    assert printed == {"transport": "shm", "control": "socket"}
    again = RunConfig.model_validate({"env": "calc", "model": "m", "pipeline": {"weight_sync": printed}})
    assert again.resolved().transport == r.transport
    assert r.with_changes({"steps": 3}).transport == r.transport  # resolves again from the same settings


def test_lora_on_moe_merges_on_the_cpu_build(monkeypatch: pytest.MonkeyPatch) -> None:
    _moe(monkeypatch, cpu=True)
    cfg = _cfg().resolved()
    assert cfg.transport == MergedSync() and not cfg.inference.enable_lora and not cfg.serves_adapter
    assert cfg.policy_model == cfg.inference.served_model_name
    with pytest.raises(SettingError, match="vLLM's CPU build cannot run on MoE layers"):
        _cfg(pipeline={"weight_sync": "shm"}).resolved()  # named explicitly: refused by the same rule
    assert _cfg(trainer={"lora": False}).resolved().transport.transport == "full"
    _moe(monkeypatch, cpu=False)
    assert _cfg().resolved().transport == ShmSync()  # GPU engines serve LoRA on MoE layers
    assert _cfg(pipeline={"weight_sync": "merged"}).resolved().transport == MergedSync()  # by choice


@pytest.mark.parametrize("whole", ["lora_train_norms", "lora_train_embedding"])
def test_an_adapter_with_tensors_trained_whole_is_served_merged(whole: str) -> None:
    """vLLM's LoRA slots hold neither norms nor an embedding: ``auto`` merges (dense model, any build), a slot
    transport is refused when the config loads, and full weights have nothing to add."""
    flag = {whole: True}
    cfg = _cfg(trainer=flag).resolved()
    assert cfg.transport == MergedSync() and not cfg.serves_adapter and not cfg.inference.enable_lora
    for name in ("shm", "network", "file"):
        with pytest.raises(ValueError, match=rf"'{name}' serves the adapter from vLLM's LoRA slots, which hold no "
                                             r"tensor trained whole .* use 'merged'"):
            _cfg(trainer=flag, pipeline={"weight_sync": name})
    with pytest.raises(ValueError, match=rf"trainer.{whole} .* full-weight training .* trains those weights already"):
        _cfg(trainer={**flag, "lora": False})


def test_an_output_layer_lora_is_served_from_the_slots() -> None:
    """``trainer.lora_train_unembed``: ``auto`` serves the adapter from the slots, the engines wrap the output
    layer beside the trained linear layers, merging is refused (the output layer is tied to the embedding on
    small models), and it cannot be combined with the embedding trained whole."""
    flag = {"lora_train_unembed": True}
    cfg = _cfg(trainer=flag).resolved()
    assert cfg.transport == ShmSync() and cfg.serves_adapter
    assert cfg.inference.lora_target_modules == [*cfg.trainer.lora_target_modules, "lm_head"]
    assert "lm_head" not in _cfg().resolved().inference.lora_target_modules
    with pytest.raises(ValueError, match=r"'merged' merges the adapter .*lora_train_unembed"):
        _cfg(trainer=flag, pipeline={"weight_sync": "merged"})
    with pytest.raises(ValueError, match=r"lora_train_unembed and trainer.lora_train_embedding .* choose one"):
        _cfg(trainer={**flag, "lora_train_embedding": True})


def test_the_rule_is_one_function_and_auto_obeys_it() -> None:
    """Every transport against every kind of run: ``settle`` accepts exactly what ``refusal`` lets through,
    and ``auto``'s choice always passes it."""
    from agentrl.config.sync import TRANSPORTS

    runs = [Served(lora, whole, moe, head) for lora in (True, False) for whole in (False, True) for moe in (False, True)
            for head in (False, True) if (lora or not whole) and (lora or not head) and not (whole and head)]
    for run in runs:
        for name, cls in TRANSPORTS.items():
            sync = cls()
            if name == "auto" and run.moe_on_cpu and run.output_lora:  # neither the slots nor a merge
                with pytest.raises(SettingError, match="finds no transport"):
                    settle(sync, run)
            elif name == "auto":
                assert refusal(settle(sync, run), run) is None
            elif refusal(sync, run) is None:
                assert settle(sync, run) is sync
            else:
                with pytest.raises(SettingError):
                    settle(sync, run)


def test_settings_that_moved_are_named() -> None:
    for key, new in (("lora_sync", "name the transport"), ("sync_control", "pipeline.weight_sync.control"),
                     ("weight_transfer_addr", "pipeline.weight_sync.addr")):
        with pytest.raises(ConfigValidationError, match=new):
            load_config(None, {"env": "calc", "pipeline": {key: "x"}})


def test_black_box_agents_of_moe_models_get_the_transport_of_the_own_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The policy endpoint's rows carry routing: a black-box agent of a MoE model is served as the own loop."""
    _moe(monkeypatch, cpu=True)
    agent = {"command": ["python", "agent.py"]}
    for replay in (True, False):
        own = _cfg(trainer={"routing_replay": replay}).resolved().transport
        assert _cfg(agent=agent, trainer={"routing_replay": replay}).resolved().transport == own


def test_an_unsettled_transport_is_refused_by_the_registry() -> None:
    from agentrl.weight_sync.base import PublishTarget
    from agentrl.weight_sync.registry import open_publisher

    with pytest.raises(SettingError, match="'auto' is not settled: resolve the config first"):
        asyncio.run(open_publisher(AutoSync(), PublishTarget(None, None)).__aenter__())
