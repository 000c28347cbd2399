"""Environment lookup by name and path; config precedence and validation; the CLI's flag set."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.config import RunConfig, load_config
from agentrl.registry import UnknownEnvironmentError, known_envs, load_env


def test_known_and_unknown_env() -> None:
    assert "calc" in known_envs()
    assert load_env("calc").__name__ == "CalcEnv"
    with pytest.raises(UnknownEnvironmentError, match=r"unknown environment 'nope'\. Known environments: .*calc"):
        load_env("nope")


def test_env_by_path() -> None:
    cls = load_env("tests.unit.test_environment:Shop")
    assert cls.name == "shop"
    with pytest.raises(UnknownEnvironmentError, match="not a subclass"):
        load_env("pathlib:Path")
    with pytest.raises(UnknownEnvironmentError, match="cannot import"):
        load_env("no_such_module_xyz:Env")


def test_config_precedence(tmp_path: Path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text('steps = 5\nname = "t"\n[trainer]\nlora_rank = 4\n[sampling]\ntemperature = 0.5\n')
    cfg = load_config(toml, {"steps": 7, "name": None})
    assert (cfg.steps, cfg.name, cfg.trainer.lora_rank, cfg.sampling.temperature) == (7, "t", 4, 0.5)
    r = cfg.model_copy(update={"model": "m/x"}).resolved()
    assert r.trainer.model_path == "m/x" and r.inference.model == "m/x"


def test_config_rejects_bad_values(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="steps"):
        RunConfig(steps=0)
    bad = tmp_path / "bad.toml"
    bad.write_text("stepz = 3\n")
    with pytest.raises(ValueError, match="stepz"):
        load_config(bad)
    with pytest.raises(FileNotFoundError):
        load_config(tmp_path / "missing.toml")


def test_cli_flag_set_is_pinned() -> None:
    """The CLI must not sprawl: adding a flag is a deliberate change to this list."""
    import typer.main

    from agentrl.cli import app

    group = typer.main.get_command(app)
    flags = {
        name: sorted(o for p in cmd.params for o in p.opts)
        for name, cmd in group.commands.items()  # type: ignore[attr-defined]
        if hasattr(cmd, "params")
    }
    assert flags["train"] == sorted(
        ["--env", "--config", "--model", "--name", "--steps", "--tasks", "--nproc", "--endpoint",
         "--env-url", "--time-limit-min", "--mode", "--max-staleness", "--resume", "--verbose", "-v"]
    )
    assert flags["eval"] == sorted(
        ["--env", "--config", "--model", "--adapter", "--n", "--temperature", "--tasks", "--endpoint",
         "--policy", "--verbose", "-v"]
    )
