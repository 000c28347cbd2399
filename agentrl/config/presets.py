"""Experiment presets: plain functions returning config values, applied under TOML files and flags.

A preset is chosen by environment name. It tunes the embedded defaults so that ``agentrl train --env NAME``
with no other flags does something useful on a CPU machine.

Its ``trainer.lr`` is for a LoRA adapter. A full-weight run (``trainer.lora = false``) that sets no
``trainer.lr`` itself gets the preset's ``full_lr`` instead, or :data:`FULL_WEIGHTS_LR` when the preset has
none (or there is no preset): see :func:`preset_for`, the one place this rule lives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

FULL_WEIGHTS_LR = 1e-5
"""AdamW learning rate of a full-weight run that sets no ``trainer.lr`` and whose preset has no ``full_lr``
(``trainer.lr``'s own default, 2e-4, is a LoRA rate: far too high for every weight)."""


def calc_tiny() -> dict[str, Any]:
    """``calc`` with the embedded tiny model on CPU: 80 steps, capped at 20 minutes on 2 cores.

    ``make train`` runs it with full weights (``--full``) at ``full_lr`` 3e-4. The LoRA adapter (lr 2e-3, on
    q/k/v/o) gained +0.065 held-out success on average over three seeds: its best learning rate is also its
    stable limit (6e-3 lost 0.12 in 24 steps). A LoRA engine also generates about 3.4x slower on vLLM's CPU
    build. Full weights at 3e-4 gained +0.24 in 24 steps in half the time per step (docs/training.md)."""
    return {
        "steps": 80,
        "tasks_per_step": 16,
        "group_size": 8,
        "eval_every": 20,
        "eval_size": 200,
        "checkpoint_every": 10,
        "time_limit_min": 20.0,
        "trainer": {"lr": 2e-3, "lora_rank": 16, "lora_alpha": 32.0},
        "full_lr": 3e-4,
        "inference": {"max_model_len": 1024},
        "sampling": {"max_context_tokens": 1024},
    }


def swe_tiny() -> dict[str, Any]:
    """``swe`` with the embedded tiny model on 2 CPUs: 3 small steps of the whole loop (episodes in Docker
    sandboxes, hidden-test grading in fresh sandboxes, training, adapter sync) in a few minutes. The tiny
    model does not fix bugs, so every reward is 0 and GRPO has nothing to learn from: this shows that the
    machinery runs, not learning. The 2048-token context (the tiny model's limit) also keeps episodes to
    a few turns."""
    return {
        "steps": 3,
        "tasks_per_step": 2,
        "group_size": 2,
        "max_concurrency": 4,
        "eval_every": 0,
        "eval_size": 4,
        "checkpoint_every": 0,
        "time_limit_min": 10.0,
        "trainer": {"lr": 1e-3, "lora_rank": 8, "lora_alpha": 16.0},
        "inference": {"max_model_len": 2048},
        "sampling": {"max_context_tokens": 2048},
    }


PRESETS: dict[str, Callable[[], dict[str, Any]]] = {"calc": calc_tiny, "swe": swe_tiny}
"""Environment name -> preset."""


def preset_for(env: str, *, full_weights: bool = False) -> dict[str, Any]:
    """The preset values for ``env`` (empty when it has none), as config settings. A preset's ``full_lr`` is
    not a setting: for a full-weight run (``full_weights``) it becomes ``trainer.lr`` (default
    :data:`FULL_WEIGHTS_LR`), otherwise it is dropped. Values set in a TOML file or by a flag override these."""
    fn = PRESETS.get(env)
    values = fn() if fn else {}
    full_lr = values.pop("full_lr", FULL_WEIGHTS_LR)
    if full_weights:
        values["trainer"] = {**values.get("trainer", {}), "lr": full_lr}
    return values
