"""A run's config resolves once into a frozen config with one model path; a change is a new config, resolved
again from the settings it came from."""

from __future__ import annotations

import pytest

from agentrl.config.base import FrozenConfigError
from agentrl.config.run import RunConfig, load_config


def test_the_resolved_config_is_frozen_at_every_depth_and_resolving_it_again_is_a_no_op() -> None:
    cfg = load_config(None, {"env": "calc"})
    r = cfg.resolved()
    assert r.is_frozen and not cfg.is_frozen and r.resolved() is r
    for assign in (lambda: setattr(r, "steps", 3), lambda: setattr(r.trainer, "lr", 1.0),
                   lambda: setattr(r.trainer.loss, "kl_coef", 0.1), lambda: setattr(r.pipeline, "max_staleness", 4)):
        with pytest.raises(FrozenConfigError, match="resolved and frozen"):
            assign()
    with pytest.raises(AttributeError):  # as a frozen dataclass
        r.sampling.temperature = 0.5
    cfg.steps = 3  # the settings themselves stay editable
    assert r.steps != 3 and r == load_config(None, {"env": "calc"}).resolved()


def test_one_model_path_reaches_the_trainer_and_the_engines() -> None:
    r = load_config(None, {"env": "calc", "model": "some/dir"}).resolved()
    assert r.trainer_config().model_path == r.server_config().model == "some/dir"
    assert "model_path" not in r.trainer.model_dump() and "model" not in r.inference.model_dump()
    # the worker's and the server's configs carry every other setting unchanged
    assert r.trainer_config().lr == r.trainer.lr and r.server_config().max_model_len == r.inference.max_model_len


def test_a_saved_config_with_the_old_copies_of_the_path_loads_and_a_different_copy_is_refused() -> None:
    old = RunConfig.model_validate({"model": "m", "trainer": {"model_path": "m", "lr": 1e-3},
                                    "inference": {"model": "m"}})
    assert old.model == "m" and old.trainer.lr == 1e-3
    with pytest.raises(ValueError, match="differs from model"):
        RunConfig.model_validate({"model": "m", "inference": {"model": "other"}})


def test_with_changes_resolves_again_from_the_settings() -> None:
    """A LoRA run whose adapter becomes merged (the MoE plan's change) serves no LoRA: the derived
    ``inference.enable_lora`` is derived anew, not carried over from the first resolution."""
    r = load_config(None, {"env": "calc"}).resolved()
    assert r.trainer.lora and r.inference.enable_lora
    merged = r.with_changes({"pipeline.lora_sync": "merged"})
    assert merged.is_frozen and merged.pipeline.lora_sync == "merged" and not merged.inference.enable_lora
    assert r.pipeline.lora_sync == "auto"  # the original is unchanged
    unresolved = load_config(None, {"env": "calc"}).with_changes({"steps": 5})
    assert unresolved.steps == 5 and not unresolved.is_frozen
    with pytest.raises(ValueError):
        r.with_changes({"steps": 0})  # checked as a config file is
