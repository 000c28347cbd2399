"""Command-line flags derived from the config: every flag names a real setting, takes its type and help from
it, and its value reaches that setting (``--lr`` included); error messages name the flag."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib
import typer.main
from typer.testing import CliRunner

from agentrl import cli
from agentrl.config import flags
from agentrl.config.errors import SettingError
from agentrl.config.policy import PolicyConfig
from agentrl.config.run import RunConfig
from agentrl.config.server import ServerConfig
from agentrl.config.tinker import TinkerConfig

SETS = [(RunConfig, flags.TRAIN), (RunConfig, flags.EVAL), (RunConfig, flags.DOCTOR),
        (PolicyConfig, flags.POLICY), (ServerConfig, flags.SERVE_ENV), (TinkerConfig, flags.TINKER)]


@pytest.mark.parametrize(("model", "flag_set"), SETS)
def test_every_flag_names_a_setting_and_takes_its_help_from_it(model: type, flag_set: tuple) -> None:
    names = [f.name for f in flag_set]
    assert len(names) == len(set(names)), "a flag twice in one command"
    for f in flag_set:
        field = flags.setting_field(model, f.setting)
        flags.value_type(model, f)  # every flag has a command-line type
        text = flags.help_text(model, f)
        if not f.help:
            assert field.description and text.startswith(" ".join(field.description.split())[:20].replace("``", "`"))


def test_a_flag_of_no_setting_is_refused() -> None:
    with pytest.raises(SettingError, match="no setting 'lrr'"):
        flags.setting_field(RunConfig, "trainer.lrr")


def test_overrides_nest_dotted_settings_and_skip_what_was_not_given() -> None:
    values = {"lr": 1e-4, "max_staleness": 2, "full": True, "agent": "python a.py --x 1", "steps": None,
              "endpoint": [], "task_column": ["question=prompt"], "report_to": "tensorboard,wandb"}
    out = flags.overrides(flags.TRAIN, values)
    assert out == {"trainer": {"lr": 1e-4, "lora": False}, "pipeline": {"max_staleness": 2},
                   "agent": {"command": ["python", "a.py", "--x", "1"]}, "task_columns": {"question": "prompt"},
                   "tracking": {"report_to": "tensorboard,wandb"}}
    assert flags.flag_names(flags.TRAIN)["trainer.lora"] == "--full"
    with pytest.raises(SettingError, match="expected FIELD=COLUMN"):
        flags.overrides(flags.TRAIN, {"task_column": ["question"]})


def test_the_commands_options_are_the_flag_sets() -> None:
    group = typer.main.get_command(cli.app)
    for command, flag_set in (("train", flags.TRAIN), ("eval", flags.EVAL), ("doctor", flags.DOCTOR),
                              ("serve-env", flags.SERVE_ENV), ("serve-policy", flags.POLICY + flags.MODEL_FLAGS),
                              ("serve-tinker", flags.TINKER)):
        opts = {o for p in group.commands[command].params for o in p.opts}  # type: ignore[attr-defined]
        assert {f.name for f in flag_set} <= opts, command


def test_lr_and_the_other_flags_reach_the_resolved_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(cli, "_setup", lambda verbose: None)  # keep pytest's own signal handlers
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli.app, ["train", "--env", "calc", "--lr", "3e-5", "--max-staleness", "2", "--seed", "7",
                                     "--report-to", "tensorboard", "--print-config"])
    assert r.exit_code == 0, r.output
    cfg = tomllib.loads(r.output)
    assert (cfg["trainer"]["lr"], cfg["pipeline"]["max_staleness"], cfg["mode"], cfg["seed"]) == (3e-5, 2, "async", 7)
    assert cfg["tracking"]["report_to"] == ["tensorboard"]
    r = CliRunner().invoke(cli.app, ["train", "--env", "calc", "--lr", "-1", "--print-config"])
    assert r.exit_code == 2 and "trainer.lr" in r.output and "--lr" in r.output, r.output


def test_a_config_files_env_is_kept_when_no_flag_names_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(cli, "_setup", lambda verbose: None)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.toml").write_text('env = "swe"\n')
    r = CliRunner().invoke(cli.app, ["train", "--config", "run.toml", "--print-config"])
    assert r.exit_code == 0, r.output
    assert tomllib.loads(r.output)["env"] == "swe"


def _commands(group: typer.core.TyperGroup, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for name, command in group.commands.items():
        sub = getattr(command, "commands", None)
        out += _commands(command, (*path, name)) if sub is not None else [(*path, name)]
    return out


def test_no_command_help_states_a_default_twice() -> None:
    """A derived help text already ends in its default; typer adding its own printed ``[default: calc]  [default:
    calc]`` (sft's ``--env``)."""
    commands = _commands(typer.main.get_command(cli.app))
    assert ("sft",) in commands and ("model", "tiny") in commands
    for path in commands:
        r = CliRunner().invoke(cli.app, [*path, "--help"], terminal_width=400)
        assert r.exit_code == 0, (path, r.output)
        for line in r.output.splitlines():
            assert line.count("[default:") <= 1, (path, line)
