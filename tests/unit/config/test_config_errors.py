"""A config error reads as one line per problem: the dotted setting, the bad value and where to fix it; no
input dict, no pydantic URL, no traceback; the CLI exits 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.config.errors import ConfigValidationError
from agentrl.config.policy import load_policy_config
from agentrl.config.run import load_config
from agentrl.config.server import load_server_config
from agentrl.core.errors import ConfigError


def _problems(toml: str, tmp_path: Path, **kw) -> tuple[Path, list[str]]:
    path = tmp_path / "run.toml"
    path.write_text(toml)
    with pytest.raises(ConfigValidationError) as info:
        load_config(path, **kw)
    assert isinstance(info.value, ValueError) and isinstance(info.value, ConfigError)
    assert info.value.code == "config.invalid"
    text = str(info.value)
    assert "pydantic.dev" not in text and "input_value" not in text and "Traceback" not in text
    return path, info.value.problems


def test_bad_value_names_the_setting_the_value_and_the_file(tmp_path: Path) -> None:
    path, problems = _problems("[trainer]\nlr = -1\n", tmp_path)
    assert problems == [f"trainer.lr: Input should be greater than 0 (got -1); set trainer.lr in {path}"]


def test_bad_flag_value_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigValidationError) as info:
        load_config(None, {"steps": 0, "mode": "bogus"}, flags={"steps": "--steps", "mode": "--mode"})
    assert info.value.problems == [
        "mode: Input should be 'sync' or 'async' (got 'bogus'); fix --mode",
        "steps: Input should be greater than or equal to 1 (got 0); fix --steps",
    ]


def test_unknown_key_suggests_the_closest_setting(tmp_path: Path) -> None:
    path, problems = _problems("lr = 1e-3\nzzzz = 1\n[trainer]\nlrr = 1e-3\n[trainer.loss]\nclip_lo = 0.1\n",
                               tmp_path)
    assert sorted(problems) == sorted([
        f"unknown setting 'lr' in {path}; did you mean 'trainer.lr'?",  # in the wrong table
        f"unknown setting 'zzzz' in {path}; remove it or fix its name",
        f"unknown setting 'trainer.lrr' in {path}; did you mean 'trainer.lr'?",
        f"unknown setting 'trainer.loss.clip_lo' in {path}; did you mean 'trainer.loss.clip_low'?",
    ])


def test_validator_messages_and_bad_toml_stay_one_line(tmp_path: Path) -> None:
    _, problems = _problems("mode = 'sync'\n[pipeline]\nmax_staleness = 2\n", tmp_path)
    assert len(problems) == 1 and problems[0].startswith("mode = 'sync' trains on-policy")
    path, problems = _problems("steps = \n", tmp_path)
    assert problems == [f"{path} is not valid TOML: Invalid value (at line 1, column 9)"]


def test_the_worker_extensions_old_name_is_refused(tmp_path: Path) -> None:
    old = "agentrl.inference.lora_ext.LoRAInPlaceExtension"
    path, problems = _problems(f"[inference]\nworker_extension = '{old}'\n", tmp_path)
    assert problems == [f"inference.worker_extension: inference.worker_extension = '{old}' is the extension's old "
                        "name, which is gone: use agentrl.engine.extension.WorkerExtension (the default) "
                        f"(got '{old}'); set inference.worker_extension in {path}"]


def test_server_and_policy_loaders(tmp_path: Path) -> None:
    secret = "not-long-enough"
    with pytest.raises(ConfigValidationError) as info:
        load_server_config(None, {"port": 99999, "token": secret}, flags={"port": "--port", "token": "--token"})
    assert info.value.problems == [
        "port: Input should be less than or equal to 65535 (got 99999); fix --port",
        "token: String should have at least 16 characters; fix --token",
    ]
    assert secret not in str(info.value)  # a token is never echoed
    path = tmp_path / "server.toml"
    path.write_text("[server]\nmax_sesions = 3\n")
    with pytest.raises(ConfigValidationError, match=r"^unknown setting 'server.max_sesions' in .*server.toml; "
                                                    r"did you mean 'server.max_sessions'\?$"):
        load_server_config(path)
    with pytest.raises(ConfigValidationError) as info:
        load_policy_config({"episode_ttl_s": -1.0}, flags={"episode_ttl_s": "--episode-ttl"})
    assert info.value.problems == ["episode_ttl_s: Input should be greater than 0 (got -1.0); fix --episode-ttl"]


def test_cli_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[trainer]\nlr = -1\n")
    cmd = [sys.executable, "-m", "agentrl.cli", "train", "--env", "calc", "--print-config"]
    r = subprocess.run([*cmd, "--config", str(bad)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == f"config error: trainer.lr: Input should be greater than 0 (got -1); " \
                               f"set trainer.lr in {bad} or --lr"
    r = subprocess.run([*cmd, "--steps", "0"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "config error: steps: Input should be greater than or equal to 1 (got 0); fix --steps"
