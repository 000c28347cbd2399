"""Full-weight RL (``trainer.lora = false``): accepted, with what it cannot do refused in one line, the model
name rollouts request, the engines' LoRA switch, the learning-rate rule and the ``--full`` flag."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentrl.config.errors import ConfigValidationError
from agentrl.config.presets import FULL_WEIGHTS_LR, preset_for
from agentrl.config.run import load_config

FULL = {"trainer": {"lora": False}}


def _problems(**over: Any) -> list[str]:
    with pytest.raises(ConfigValidationError) as info:
        load_config(None, {"env": "calc", **over})
    return info.value.problems


def test_full_weights_are_accepted_and_sample_from_the_base_model() -> None:
    cfg = load_config(None, {"env": "calc", **FULL})
    assert cfg.trainer.lora is False and cfg.policy_model == cfg.inference.served_model_name == "base"
    assert cfg.final_policy_dir == cfg.run_dir / "final_model"
    lora = load_config(None, {"env": "calc", "adapter_name": "mine"})
    assert lora.policy_model == "mine" and lora.final_policy_dir == lora.run_dir / "final_adapter"
    renamed = load_config(None, {"env": "calc", "inference": {"served_model_name": "qwen"}, **FULL})
    assert renamed.policy_model == "qwen"


def test_a_kl_penalty_with_full_weights_is_refused_in_one_line() -> None:
    problems = _problems(trainer={"lora": False, "loss": {"kl_coef": 0.05}})
    assert len(problems) == 1 and "\n" not in problems[0]
    assert problems[0].startswith("trainer.loss.kl_coef = 0.05 needs a reference policy")
    assert "second, frozen, sharded copy" in problems[0] and problems[0].endswith(
        "use LoRA or trainer.loss.kl_coef = 0")
    assert load_config(None, {"env": "calc", "trainer": {"loss": {"kl_coef": 0.05}}}).trainer.loss.kl_coef == 0.05


def test_an_adapter_transport_with_full_weights_is_refused() -> None:
    for name in ("file", "shm", "network", "merged"):
        problems = _problems(pipeline={"weight_sync": name}, **FULL)
        assert len(problems) == 1 and problems[0].startswith(f"pipeline.weight_sync = '{name}' serves a LoRA adapter")
        assert "use 'full' (through shared memory or the call body) or 'nccl'" in problems[0]
    for carrier in ("shm", "network"):
        cfg = load_config(None, {"env": "calc", "pipeline": {"weight_sync": {"transport": "full", "carrier": carrier}},
                                 **FULL})
        assert cfg.transport.transport == "full" and cfg.resolved().transport.carrier == carrier
    assert load_config(None, {"env": "calc", **FULL}).resolved().transport.transport == "full"  # what auto picks


def test_full_weight_engines_serve_no_lora_unless_asked() -> None:
    assert load_config(None, {"env": "calc", **FULL}).resolved().inference.enable_lora is False
    asked = load_config(None, {"env": "calc", "inference": {"enable_lora": True}, **FULL}).resolved()
    assert asked.inference.enable_lora is True
    assert load_config(None, {"env": "calc"}).resolved().inference.enable_lora is True  # calc's preset: slots
    merged = {"env": "calc", "trainer": {"lora_train_embedding": True}}  # the embedding trained whole: merged
    assert load_config(None, merged).resolved().inference.enable_lora is False
    twice = load_config(None, {"env": "calc", **FULL}).resolved().resolved()
    assert twice.inference.enable_lora is False


def test_full_weights_get_a_full_weight_learning_rate_unless_one_is_set(tmp_path: Path) -> None:
    assert load_config(None, {"env": "calc"}).trainer.lr == 2e-3  # the preset's LoRA rate
    assert load_config(None, {"env": "calc", **FULL}).trainer.lr == 4e-4  # the preset's full values
    assert load_config(None, {"env": "swe", **FULL}).trainer.lr == FULL_WEIGHTS_LR  # a preset without them
    assert load_config(None, {"env": "weather.py:Weather", **FULL}).trainer.lr == FULL_WEIGHTS_LR  # no preset
    assert load_config(None, {"env": "weather.py:Weather"}).trainer.lr == 2e-4  # the field's LoRA default
    assert load_config(None, {"env": "calc", "trainer": {"lora": False, "lr": 3e-6}}).trainer.lr == 3e-6
    toml = tmp_path / "run.toml"
    toml.write_text("[trainer]\nlora = false\n")
    assert load_config(toml, {"env": "calc"}).trainer.lr == 4e-4
    toml.write_text("[trainer]\nlora = false\nlr = 1e-6\n")
    assert load_config(toml, {"env": "calc"}).trainer.lr == 1e-6
    assert "full" not in preset_for("calc") and preset_for("calc")["trainer"]["lr"] == pytest.approx(2e-3)
    full = preset_for("calc", full_weights=True)
    assert "full" not in full and full["trainer"]["lora_rank"] == 16, "the full values go over the others"
    assert full["trainer"]["lr"] == 4e-4 and full["trainer"]["lr_schedule"] == "cosine"
    assert full["steps"] == preset_for("calc")["steps"] == 80


def test_full_flag_reaches_the_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import tomllib
    from typer.testing import CliRunner

    from agentrl import cli

    monkeypatch.setattr(cli, "_setup", lambda verbose: None)  # keep pytest's own signal handlers
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli.app, ["train", "--env", "calc", "--full", "--print-config"])
    assert r.exit_code == 0, r.output
    cfg = tomllib.loads(r.output)
    assert cfg["trainer"]["lora"] is False and cfg["trainer"]["lr"] == 4e-4
    assert (cfg["trainer"]["lr_schedule"], cfg["trainer"]["lr_decay_steps"]) == ("cosine", 80)
    assert cfg["inference"]["enable_lora"] is False
    r = CliRunner().invoke(cli.app, ["train", "--env", "calc", "--print-config"])
    assert tomllib.loads(r.output)["trainer"]["lora"] is True
    (tmp_path / "kl.toml").write_text("[trainer.loss]\nkl_coef = 0.1\n")
    r = CliRunner().invoke(cli.app, ["train", "--env", "calc", "--full", "--config", "kl.toml", "--print-config"])
    assert r.exit_code == 2 and "trainer.loss.kl_coef = 0.1 needs a reference policy" in r.output
    assert list(tmp_path.iterdir()) == [tmp_path / "kl.toml"], "--print-config must not create anything"


def test_nccl_sync_is_for_full_weights_and_starts_the_engines_transfer_engine(tmp_path: Path) -> None:
    from agentrl.inference import VLLMServer

    problems = _problems(pipeline={"weight_sync": "nccl"})
    assert len(problems) == 1 and problems[0].startswith("pipeline.weight_sync = 'nccl' streams full weights")
    cfg = load_config(None, {"env": "calc", "pipeline": {"weight_sync": "nccl"}, **FULL}).resolved()
    assert cfg.inference.weight_transfer_backend == "nccl"
    cmd = VLLMServer(cfg.server_config(), tmp_path).build_command()
    assert cmd[cmd.index("--weight-transfer-config") + 1] == '{"backend": "nccl"}'
    plain = load_config(None, {"env": "calc", **FULL}).resolved()
    assert "--weight-transfer-config" not in VLLMServer(plain.server_config(), tmp_path).build_command()


def test_the_embedded_presets_serve_the_model_in_the_trainers_dtype() -> None:
    """The embedded model is float32 and so is the trainer's compute: the engine of a preset run samples in
    float32 too (vLLM's ``auto`` would cast it to 16 bits), unless the run says otherwise."""
    for env in ("calc", "swe"):
        cfg = load_config(None, {"env": env})
        assert cfg.inference.dtype == cfg.trainer.dtype == "float32", env
    assert load_config(None, {"env": "calc", "inference": {"dtype": "bfloat16"}}).inference.dtype == "bfloat16"
    assert load_config(None, {"env": "weather.py:Weather"}).inference.dtype == "auto"  # no preset: vLLM's choice


def test_the_embedded_models_rates_do_not_reach_a_real_model(tmp_path: Path) -> None:
    """A preset's ``embedded`` values (rates tuned for the 1.2M-parameter model, its engine dtype) apply to the
    embedded model and its copies only; the environment's values (steps, batch shape, context) to every model."""
    import json

    from agentrl.config.presets import is_embedded_model

    real = tmp_path / "real"
    real.mkdir()
    (real / "config.json").write_text("{}")
    cfg = load_config(None, {"env": "calc", "model": str(real)})
    assert cfg.trainer.lr == 2e-4 and cfg.inference.dtype == "auto"  # the fields' own defaults
    assert (cfg.steps, cfg.tasks_per_step, cfg.sampling.max_context_tokens) == (80, 16, 1024)
    assert load_config(None, {"env": "calc", "model": str(real), **FULL}).trainer.lr == FULL_WEIGHTS_LR
    copy = tmp_path / "tiny-copy"
    copy.mkdir()
    (copy / "agentrl_model.json").write_text(json.dumps({"config": {"seed": 1, "shape": {"hidden_size": 128}}}))
    assert is_embedded_model(copy) and not is_embedded_model(real)
    cfg = load_config(None, {"env": "calc", "model": str(copy)})
    assert cfg.trainer.lr == pytest.approx(2e-3) and cfg.trainer.lr_schedule == "cosine" and cfg.inference.dtype == "float32"
    assert load_config(None, {"env": "calc"}).inference.dtype == "float32"  # the default, before it is installed
