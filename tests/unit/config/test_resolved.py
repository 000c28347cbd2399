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
    """A LoRA run whose adapter becomes merged serves no LoRA: the derived ``inference.enable_lora`` is derived
    anew, not carried over from the first resolution."""
    r = load_config(None, {"env": "calc", "trainer": {"lora_train_embedding": False}}).resolved()
    assert r.trainer.lora and r.inference.enable_lora
    merged = r.with_changes({"pipeline.weight_sync": "merged", "trainer.lora_train_unembed": False})
    assert merged.is_frozen and merged.transport.transport == "merged" and not merged.inference.enable_lora
    assert r.transport.transport == "shm"  # the original is unchanged (auto settled on the slots)
    unresolved = load_config(None, {"env": "calc"}).with_changes({"steps": 5})
    assert unresolved.steps == 5 and not unresolved.is_frozen
    with pytest.raises(ValueError):
        r.with_changes({"steps": 0})  # checked as a config file is


def test_a_changed_config_keeps_the_settings_that_are_never_printed() -> None:
    """``env_token`` is left out of every dump (it is a secret), so a change rebuilt from a dump lost it and
    the run then met its env server without a token (HTTP 401)."""
    cfg = load_config(None, {"env": "calc", "env_url": "http://127.0.0.1:9", "env_token": "s3cret"})
    assert "s3cret" not in cfg.resolved().to_toml()
    for changed in (cfg.with_changes({"steps": 3}), cfg.resolved().with_changes({"steps": 4})):
        assert changed.env_token == "s3cret" and changed.env_url == "http://127.0.0.1:9"


def test_the_worker_and_server_configs_carry_every_setting_given() -> None:
    r = load_config(None, {"env": "calc", "trainer": {"lr": 3e-4, "loss": {"clip_high": 0.3}},
                           "inference": {"max_model_len": 512, "extra_args": ["--enforce-eager"]}}).resolved()
    t, s = r.trainer_config(), r.server_config()
    assert (t.lr, t.loss.clip_high, t.seed) == (3e-4, 0.3, r.seed)
    assert (s.max_model_len, s.extra_args, s.enable_lora) == (512, ["--enforce-eager"], r.inference.enable_lora)
