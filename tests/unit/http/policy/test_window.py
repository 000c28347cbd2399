"""``agentrl serve-policy``'s window: ``--max-context-tokens``, else a saved policy's, else the model's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.config import flags
from agentrl.config.errors import ConfigValidationError
from agentrl.config.policy import DEFAULT_CONTEXT_TOKENS, PolicyConfig, load_policy_config
from agentrl.config.run import load_config
from agentrl.config.window import WindowTooLong
from agentrl.core.shape import read_window
from agentrl.http.policy.run import window_settings


def _model(directory: Path, config: object) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return str(directory)


def test_read_window(tmp_path: Path) -> None:
    assert read_window(_model(tmp_path / "a", {"max_position_embeddings": 8192})) == 8192
    assert read_window(_model(tmp_path / "b", {"text_config": {"max_position_embeddings": 4096}})) == 4096
    for bad in ({}, {"max_position_embeddings": True}, {"max_position_embeddings": "8192"}, [1]):
        assert read_window(_model(tmp_path, bad)) is None
    (tmp_path / "config.json").write_text("{not json")
    assert read_window(str(tmp_path)) is None
    assert read_window(str(tmp_path / "missing")) is None and read_window("HuggingFaceTB/SmolLM2-135M") is None


def test_the_model_window_beats_the_calc_preset(tmp_path: Path) -> None:
    model = _model(tmp_path, {"max_position_embeddings": 8192})
    window = window_settings(None, model)
    assert window == {"inference": {"max_model_len": 8192}, "sampling": {"max_context_tokens": 8192}}
    assert load_config(None, {"model": model, **window}).context_tokens == 8192
    assert load_config(None, {"model": model}).context_tokens == 8192  # train and eval: the same rule
    tiny = _model(tmp_path / "tiny", {"max_position_embeddings": 2048})
    (tmp_path / "tiny" / "agentrl_model.json").write_text(json.dumps({"config": {"shape": "tiny"}}))
    assert window_settings(None, tiny)["sampling"] == {"max_context_tokens": 2048}  # never calc's preset here
    assert load_config(None, {"model": tiny}).context_tokens == 1024  # a run on the embedded model: calc's


def test_a_given_window_and_a_saved_policys(tmp_path: Path) -> None:
    model = _model(tmp_path, {"max_position_embeddings": 8192})
    assert window_settings(4096, model)["sampling"] == {"max_context_tokens": 4096}
    with pytest.raises(WindowTooLong, match=r"--max-context-tokens 9000 is more than the window .* give at most 8192"):
        window_settings(9000, model)
    trained = {"sampling": {"max_context_tokens": 1024}, "inference": {"max_model_len": 1024}}
    assert window_settings(None, model, trained) == {}  # the saved policy's layer holds its window
    assert window_settings(2048, model, trained)["inference"] == {"max_model_len": 2048}
    assert window_settings(None, "some/hub-model")["sampling"] == {"max_context_tokens": DEFAULT_CONTEXT_TOKENS}
    assert window_settings(3000, "some/hub-model")["sampling"] == {"max_context_tokens": 3000}


def test_the_endpoint_window_setting_and_flag() -> None:
    assert PolicyConfig().context_tokens == DEFAULT_CONTEXT_TOKENS == 2048
    assert PolicyConfig(max_context_tokens=8192).context_tokens == 8192
    assert "--max-context-tokens" in flags.flag_names(flags.POLICY).values()
    with pytest.raises(ConfigValidationError, match="--max-context-tokens"):
        load_policy_config({"max_context_tokens": 8}, flags=flags.flag_names(flags.POLICY))


def test_serve_policy_refuses_a_window_beyond_the_model_before_starting(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from agentrl import cli

    model = _model(tmp_path / "m", {"max_position_embeddings": 8192})
    r = CliRunner().invoke(cli.app, ["serve-policy", "--model", model, "--max-context-tokens", "9000"])
    assert r.exit_code != 0 and "give at most 8192" in r.output
