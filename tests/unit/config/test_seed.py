"""The run's seed (``--seed``) seeds the trainer too, unless ``trainer.seed`` is set itself."""

from __future__ import annotations

from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.config.run import load_config


def test_the_trainer_takes_the_run_seed_unless_it_has_its_own() -> None:
    assert load_config(None, {"env": "calc"}).resolved().trainer.seed == 0
    cfg = load_config(None, {"env": "calc", "seed": 7}).resolved()
    assert (cfg.seed, cfg.trainer.seed) == (7, 7)
    own = load_config(None, {"env": "calc", "seed": 7, "trainer": {"seed": 3}}).resolved()
    assert (own.seed, own.trainer.seed) == (7, 3)


def test_seed_flag_reaches_the_resolved_config() -> None:
    out = CliRunner().invoke(app, ["train", "--env", "calc", "--seed", "5", "--print-config"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert "seed = 5" in lines  # the run's
    trainer = lines[lines.index("[trainer]"):]
    assert "seed = 5" in trainer[: next(i for i, x in enumerate(trainer[1:], 1) if x.startswith("["))]
