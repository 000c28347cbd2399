"""A run's window on a model directory (``agentrl train``, ``agentrl eval``): the model's own
(``max_position_embeddings``) unless a file, a flag or a saved policy gives one; the embedded tiny model keeps
its preset's; a window beyond the model's is refused naming the flag; the trainer's budget holds one episode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentrl.config import flags
from agentrl.config.run import DEFAULT_MODEL, load_config
from agentrl.config.window import WindowTooLong

TRAIN_FLAGS = flags.flag_names(flags.TRAIN)


def _model(directory: Path, window: int = 8192, *, embedded: bool = False) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": window}))
    if embedded:  # the marker the embedded tiny model's build writes
        (directory / "agentrl_model.json").write_text(json.dumps({"config": {"shape": "tiny"}}))
    return str(directory)


def _window(cfg: Any) -> tuple[int, int, int]:
    return cfg.inference.max_model_len, cfg.sampling.max_context_tokens, cfg.context_tokens


def test_a_model_directory_gives_its_own_window_not_the_presets(tmp_path: Path) -> None:
    model = _model(tmp_path / "smollm2")
    cfg = load_config(None, {"env": "calc", "model": model})
    assert _window(cfg) == (8192, 8192, 8192)
    assert _window(load_config(None, {"env": "swe", "model": model})) == (8192, 8192, 8192)  # any preset
    assert _window(load_config(None, {"env": "calc", "model": _model(tmp_path / "small", 512)})) == (512, 512, 512)
    # a hub id (or a model not built yet) declares nothing: the preset's window, as before
    assert _window(load_config(None, {"env": "calc", "model": "org/some-model"})) == (1024, 1024, 1024)


def test_the_embedded_tiny_model_keeps_the_calc_presets_window(tmp_path: Path) -> None:
    tiny = _model(tmp_path / "tiny", 2048, embedded=True)
    for model in (tiny, DEFAULT_MODEL):
        cfg = load_config(None, {"env": "calc", "model": model})
        assert _window(cfg) == (1024, 1024, 1024)
        assert cfg.resolved().trainer.micro_batch_tokens == 4096
    # told otherwise, it takes what it is told (one setting sizes both)
    assert _window(load_config(None, {"model": tiny, "sampling": {"max_context_tokens": 2048}})) == (2048, 2048, 2048)


def test_a_given_window_wins_and_sizes_both_settings(tmp_path: Path) -> None:
    model = _model(tmp_path / "m")
    flag = load_config(None, {"model": model, "sampling": {"max_context_tokens": 2048}}, flags=TRAIN_FLAGS)
    assert _window(flag) == (2048, 2048, 2048)  # the engines' window follows: no 8,192-token cache for it
    toml = tmp_path / "run.toml"
    toml.write_text(f'model = "{model}"\n[inference]\nmax_model_len = 4096\n')
    assert _window(load_config(toml)) == (4096, 4096, 4096)
    both = load_config(toml, {"sampling": {"max_context_tokens": 1024}})
    assert _window(both) == (4096, 1024, 1024) and _window(both.resolved())[1:] == (1024, 1024)


def test_a_saved_policys_window_keeps_precedence(tmp_path: Path) -> None:
    model = _model(tmp_path / "m")
    trained = {"model": model, "sampling": {"max_context_tokens": 1024}, "inference": {"max_model_len": 1024}}
    assert _window(load_config(None, {}, beneath=trained)) == (1024, 1024, 1024)
    # a flag still wins, and sizes the engines too (as serve-policy's --max-context-tokens does)
    told = load_config(None, {"sampling": {"max_context_tokens": 2048}}, beneath=trained)
    assert _window(told) == (2048, 2048, 2048)
    # a policy described by its adapter alone (no window): the model's
    assert _window(load_config(None, {}, beneath={"model": model})) == (8192, 8192, 8192)


def test_a_window_beyond_the_models_is_refused_naming_the_flag_or_the_file(tmp_path: Path) -> None:
    model = _model(tmp_path / "m")
    with pytest.raises(WindowTooLong, match=r"^--max-context-tokens 9000 is more than the window of .*"
                                            r"max_position_embeddings = 8192\); give at most 8192$"):
        load_config(None, {"model": model, "sampling": {"max_context_tokens": 9000}}, flags=TRAIN_FLAGS)
    toml = tmp_path / "run.toml"
    toml.write_text(f'model = "{model}"\n[inference]\nmax_model_len = 16384\n')
    with pytest.raises(WindowTooLong, match=r"^inference.max_model_len = 16384 in .*run.toml is more than the window"):
        load_config(toml)
    tiny = _model(tmp_path / "tiny", 2048, embedded=True)
    with pytest.raises(WindowTooLong, match="give at most 2048"):
        load_config(None, {"model": tiny, "sampling": {"max_context_tokens": 4096}}, flags=TRAIN_FLAGS)
    assert load_config(None, {"model": model, "sampling": {"max_context_tokens": 8192}}).context_tokens == 8192


def test_the_trainers_budget_holds_one_whole_episode_unless_set(tmp_path: Path) -> None:
    model = _model(tmp_path / "m")
    cfg = load_config(None, {"env": "calc", "model": model})
    assert cfg.micro_batch_budget == 8192 and cfg.training_problems() == []
    resolved = cfg.resolved()
    assert resolved.trainer.micro_batch_tokens == resolved.trainer_config().micro_batch_tokens == 8192
    short = load_config(None, {"model": model, "sampling": {"max_context_tokens": 1024}}).resolved()
    assert short.trainer.micro_batch_tokens == 4096  # the default, when one episode fits it
    set_small = load_config(None, {"model": model, "trainer": {"micro_batch_tokens": 4096}})
    assert any("max_context_tokens = 8192 is more than trainer.micro_batch_tokens = 4096" in p
               for p in set_small.training_problems())
    assert set_small.resolved().trainer.micro_batch_tokens == 4096  # a set budget is never changed


def test_train_and_eval_take_the_window_flag(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from agentrl import cli

    model = _model(tmp_path / "m")
    runner = CliRunner()
    shown = runner.invoke(cli.app, ["train", "--env", "calc", "--model", model, "--print-config"])
    assert shown.exit_code == 0, shown.output
    assert "max_model_len = 8192" in shown.output and "max_context_tokens = 8192" in shown.output
    assert "micro_batch_tokens = 8192" in shown.output
    told = runner.invoke(cli.app, ["train", "--model", model, "--max-context-tokens", "2048", "--print-config"])
    assert told.exit_code == 0 and "max_model_len = 2048" in told.output, told.output
    for command in ("train", "eval"):
        r = runner.invoke(cli.app, [command, "--env", "calc", "--model", model, "--max-context-tokens", "9000"])
        assert r.exit_code == 2 and "--max-context-tokens 9000" in r.output and "give at most 8192" in r.output
