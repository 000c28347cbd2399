"""Environment lookup by name and path; config precedence and validation; the CLI's flag set."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.config.run import RunConfig, load_config
from agentrl.environment.registry import UnknownEnvironmentError, known_envs, load_env


def test_known_and_unknown_env() -> None:
    assert "calc" in known_envs()
    assert load_env("calc").__name__ == "CalcEnv"
    with pytest.raises(UnknownEnvironmentError, match=r"unknown environment 'nope'\. Known environments: .*calc"):
        load_env("nope")


def test_env_by_path() -> None:
    cls = load_env("tests.unit.environment.test_base:Shop")
    assert cls.name == "shop"
    with pytest.raises(UnknownEnvironmentError, match="not a subclass"):
        load_env("pathlib:Path")
    with pytest.raises(UnknownEnvironmentError, match="no module 'no_such_module_xyz'"):
        load_env("no_such_module_xyz:Env")


def test_config_precedence(tmp_path: Path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text('steps = 5\nname = "t"\n[trainer]\nlora_rank = 4\n[sampling]\ntemperature = 0.5\n')
    cfg = load_config(toml, {"steps": 7, "name": None})
    assert (cfg.steps, cfg.name, cfg.trainer.lora_rank, cfg.sampling.temperature) == (7, "t", 4, 0.5)
    r = cfg.model_copy(update={"model": "m/x"}).resolved()
    assert r.trainer_config().model_path == "m/x" and r.server_config().model == "m/x"


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
        ["--env", "--config", "--model", "--tool-parser", "--chat-template", "--name", "--steps", "--tasks", "--nproc",
         "--endpoint",
         "--tasks-split", "--eval-tasks", "--eval-tasks-split", "--task-column",
         "--env-url", "--time-limit-min", "--mode", "--max-staleness", "--temperature", "--resume",
         "--print-config", "--inference-gpus", "--trainer-gpus", "--dry-run", "--agent", "--agent-reward", "--agent-image", "--full", "--report-to", "--seed",
         "--lr", "--max-context-tokens",
         "--verbose", "-v"]
    )
    assert flags["eval"] == sorted(
        ["--env", "--config", "--model", "--tool-parser", "--chat-template", "--adapter", "--n", "--temperature", "--tasks",
         "--tasks-split", "--task-column", "--max-context-tokens",
         "--endpoint", "--policy", "--verbose", "-v"]
    )
    assert flags["doctor"] == sorted(["--model", "--tool-parser", "--chat-template", "--json"])
    assert flags["serve-policy"] == sorted(["--model", "--endpoint", "--tool-parser", "--chat-template", "--host", "--port",
                                            "--token", "--episode-ttl", "--max-context-tokens", "--adapter", "--verbose",
                                            "-v"])
    assert flags["export"] == sorted(["run_or_adapter", "--out", "--dtype", "--adapter-only"])
    assert flags["sft"] == sorted(["--model", "--out", "--env", "--data", "--chat-template", "--steps", "--batch-size",
                                   "--lr", "--full", "--lora-rank", "--examples", "--seed"])


def test_sync_is_eta_zero_and_conflicts_are_errors() -> None:
    """One rule: sync is η = 0, async is η ≥ 1; a mode that contradicts η says what to change."""
    cfg = RunConfig()
    assert (cfg.mode, cfg.pipeline.max_staleness) == ("sync", 0)
    cfg = RunConfig(pipeline={"max_staleness": 2})
    assert (cfg.mode, cfg.pipeline.max_staleness) == ("async", 2), "--max-staleness 2 alone is async"
    assert RunConfig(mode="async").pipeline.max_staleness == 2  # ASYNC_MAX_STALENESS, chosen by measurement
    with pytest.raises(ValueError, match=r"mode = 'sync' trains on-policy .* use mode = 'async'"):
        RunConfig(mode="sync", pipeline={"max_staleness": 2})
    with pytest.raises(ValueError, match="max_staleness 0 is mode = 'sync'"):
        RunConfig(mode="async", pipeline={"max_staleness": 0})
    with pytest.raises(ValueError, match="cannot hold one step"):
        RunConfig(tasks_per_step=8, pipeline={"capacity_groups": 4})
    cfg = load_config(None, {"mode": "async", "pipeline": {"max_staleness": 3}})
    assert (cfg.pipeline.capacity(cfg.tasks_per_step), cfg.pipeline.max_staleness) == (4 * cfg.tasks_per_step, 3)


def test_training_refuses_what_the_trainer_cannot_reproduce() -> None:
    assert RunConfig(sampling={"temperature": 0.7}).training_problems() == []
    greedy = RunConfig(sampling={"temperature": 0.0})
    assert len(greedy.training_problems()) == 1 and "greedy" in greedy.training_problems()[0]
    with pytest.raises(ValueError, match="cannot train correctly"):
        greedy.check_trainable()
    raw = RunConfig(sampling={"temperature": 0.7}, inference={"logprobs_mode": "raw_logprobs"})
    assert "processed_logprobs" in raw.training_problems()[0]


@pytest.mark.parametrize("sampling", [{"top_p": 0.9}, {"top_k": 20}, {"min_p": 0.05},
                                      {"top_p": 0.9, "top_k": 20, "min_p": 0.05, "temperature": 0.7}])
def test_truncated_sampling_trains_with_masks_and_is_refused_where_none_are_recorded(sampling: dict) -> None:
    cfg = RunConfig(sampling=sampling)
    assert cfg.sampling.truncates and cfg.training_problems() == []
    assert RunConfig(sampling=sampling, agent={"command": ["my-agent"]}).training_problems() == []
    raw = RunConfig(sampling=sampling, inference={"logprobs_mode": "raw_logprobs"}).training_problems()
    assert raw and all("processed_logprobs" in p for p in raw)
    assert not RunConfig().sampling.truncates


def test_resolved_config_round_trips_through_toml(tmp_path: Path) -> None:
    cfg = load_config(None, {"mode": "async", "steps": 3, "sampling": {"temperature": 0.7}}).resolved()
    path = tmp_path / "resolved.toml"
    path.write_text(cfg.to_toml())
    again = load_config(path).resolved()
    assert again == cfg and "[pipeline]" in path.read_text() and "[trainer.loss]" in path.read_text()


def test_config_module_is_a_leaf() -> None:
    """Importing the config pulls in no runtime module of agentrl (and neither torch nor vLLM)."""
    import subprocess
    import sys

    runtime = ("torch", "vllm", "agentrl.orchestrator.loop", "agentrl.orchestrator.evaluate", "agentrl.launch.stack", "agentrl.orchestrator.run",
               "agentrl.rollout.loop", "agentrl.orchestrator.buffer", "agentrl.rollout.groups", "agentrl.rollout.episode")
    code = f"import sys, agentrl.config.run; print(sorted(m for m in sys.modules if m in {runtime!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
