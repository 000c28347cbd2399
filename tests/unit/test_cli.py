"""The CLI: light to start, and bad input answered with a clear error and a non-zero exit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "agentrl.cli"]


def run(*args: str, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def test_help_imports_no_heavy_library() -> None:
    code = (
        "import sys; from typer.testing import CliRunner; from agentrl.cli import app; "
        "r = CliRunner().invoke(app, ['--help']); assert r.exit_code == 0, r.output; "
        "print([m for m in ('torch', 'vllm', 'transformers', 'peft') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_unknown_env_lists_known_ones() -> None:
    r = run("train", "--env", "nosuchenv")
    assert r.returncode == 2
    assert "unknown environment 'nosuchenv'" in r.stderr and "calc" in r.stderr


def test_model_dir_without_tokenizer(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    r = run("eval", "--env", "calc", "--model", str(tmp_path), "--n", "1")
    assert r.returncode == 2
    assert "has no tokenizer" in r.stderr


def test_missing_model_dir_and_bad_adapter(tmp_path: Path) -> None:
    r = run("eval", "--env", "calc", "--model", str(tmp_path / "nope"))
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = run("eval", "--env", "calc", "--adapter", str(tmp_path))
    assert r.returncode == 2 and "holds no saved policy" in r.stderr


def test_unreachable_endpoint(tiny_tokenizer_model: Path) -> None:
    r = run("eval", "--env", "calc", "--model", str(tiny_tokenizer_model), "--endpoint", "http://127.0.0.1:9", "--n", "1")
    assert r.returncode == 2
    assert "not reachable" in r.stderr and "127.0.0.1:9" in r.stderr


def test_interrupted_train_exits_130_cleanly(monkeypatch, tmp_path: Path) -> None:
    """Ctrl-C (or SIGTERM, which the CLI turns into KeyboardInterrupt) ends `train` with 130, not an error."""
    from typer.testing import CliRunner

    from agentrl import cli
    from agentrl.orchestrator.run import TrainingRun

    async def interrupted(self: TrainingRun) -> dict:
        raise KeyboardInterrupt

    monkeypatch.setattr(TrainingRun, "run", interrupted)
    monkeypatch.setattr(cli, "_setup", lambda verbose: None)  # keep pytest's own signal handlers
    r = CliRunner().invoke(cli.app, ["train", "--env", "calc", "--name", str(tmp_path / "r")])
    assert r.exit_code == 130, r.output
    assert "interrupted" in r.output and "error" not in r.output


def test_sandbox_commands_answer_help_without_an_engine() -> None:
    """`--help` must print usage, never try to reach Docker or build an image named "--help"."""
    for cmd in (["sandbox", "build", "--help"], ["sandbox", "gc", "--help"]):
        r = run(*cmd, timeout=60)
        assert r.returncode == 0 and "usage: agentrl sandbox" in r.stdout, (cmd, r.stdout, r.stderr)


def test_print_config_prints_the_resolved_toml_and_starts_nothing(tmp_path: Path) -> None:
    import tomllib

    r = run("train", "--env", "calc", "--max-staleness", "2", "--temperature", "0.7", "--print-config",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    cfg = tomllib.loads(r.stdout)
    assert (cfg["mode"], cfg["pipeline"]["max_staleness"], cfg["sampling"]["temperature"]) == ("async", 2, 0.7)
    assert "model_path" not in cfg["trainer"] and "model" not in cfg["inference"]  # one model path: model
    assert list(tmp_path.iterdir()) == [], "--print-config must not create anything"


def test_conflicting_mode_and_untrainable_sampling_are_clear_errors() -> None:
    r = run("train", "--env", "calc", "--mode", "sync", "--max-staleness", "2", "--print-config")
    assert r.returncode == 2 and "use mode = 'async'" in r.stderr
    r = run("train", "--env", "calc", "--temperature", "0", "--print-config")
    assert r.returncode == 2 and "greedy decoding has no sampling distribution" in r.stderr


def test_doctor_reports_a_family_and_refuses_the_wrong_parser(monkeypatch, tmp_path: Path) -> None:
    """`agentrl doctor --json` ends with one JSON object; a failing check exits 1 and names the flag (run in
    this process: each of the three runs would otherwise import vLLM's tool parsers anew)."""
    from typer.testing import CliRunner

    from agentrl import cli
    from tests.fixtures_families import FAMILIES, build_family_tokenizer

    monkeypatch.setattr(cli, "_setup", lambda verbose: None)  # keep pytest's own logging and signal handlers
    build_family_tokenizer(FAMILIES["llama3.1"], tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))

    def doctor(*args: str) -> tuple[int, str]:
        r = CliRunner().invoke(cli.app, ["doctor", "--model", str(tmp_path), *args])
        return r.exit_code, r.stdout

    code, out = doctor("--tool-parser", "llama3_json", "--json")
    assert code == 0, out
    report = json.loads(out.strip().splitlines()[-1])
    assert report["tool_parser"] == "llama3_json" and report["problems"] == []
    assert report["chat_template_appends_only"] and report["roundtrip_ok"] and report["observation_delta_ok"]
    assert "<|eot_id|>" in report["stop_tokens"] and len(report["stop_token_ids"]) == 3
    code, out = doctor("--json")  # hermes cannot read Llama's calls
    assert code == 1
    report = json.loads(out.strip().splitlines()[-1])
    assert not report["roundtrip_ok"] and "--tool-parser llama3_json" in report["problems"][0]
    code, out = doctor("--tool-parser", "nope")
    assert code == 1 and "unknown tool parser 'nope'" in out


def test_full_weight_rl_is_accepted_and_what_it_cannot_do_refused_at_config_time(tmp_path: Path) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text("[trainer]\nlora = false\n")
    r = run("train", "--env", "calc", "--config", str(cfg), "--print-config")
    assert r.returncode == 0, r.stderr
    assert "lora = false" in r.stdout and "enable_lora = false" in r.stdout
    cfg.write_text("[trainer]\nlora = false\n[pipeline]\nweight_sync = \"file\"\n")
    r = run("train", "--env", "calc", "--config", str(cfg), "--print-config")
    assert r.returncode == 2 and "config error: pipeline.weight_sync = 'file' serves a LoRA adapter" in r.stderr


def test_a_whole_model_given_as_adapter_is_evaluated_as_the_model(tmp_path: Path) -> None:
    """A full-weight run's final_model/ is a model directory: --adapter evaluates it as the model (this one has
    no tokenizer, which the model's check reports)."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    r = run("eval", "--env", "calc", "--adapter", str(tmp_path))
    assert r.returncode == 2 and "has no tokenizer" in r.stderr and str(tmp_path) in r.stderr


def test_train_refuses_a_model_that_fails_the_doctor_naming_the_flag(monkeypatch, tmp_path: Path) -> None:
    """`agentrl train` runs the doctor's checks before starting anything: Llama 3.1's JSON tool calls are not
    read by the default hermes parser, and the error names the flag that fixes it."""
    from typer.testing import CliRunner

    from agentrl import cli
    from tests.fixtures_families import FAMILIES, build_family_tokenizer

    monkeypatch.setattr(cli, "_setup", lambda verbose: None)  # keep pytest's own logging and signal handlers
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "llama"
    build_family_tokenizer(FAMILIES["llama3.1"], model)
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    r = CliRunner().invoke(cli.app, ["train", "--env", "calc", "--model", str(model), "--steps", "1"])
    assert r.exit_code == 2, r.output
    assert "fails agentrl doctor's checks" in r.stderr and "--tool-parser llama3_json" in r.stderr
