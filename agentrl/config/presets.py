"""Experiment presets: plain functions returning config values, applied under TOML files and flags.

A preset is chosen by environment name. It tunes the embedded defaults so that ``agentrl train --env NAME``
with no other flags does something useful on a CPU machine.

Its values under ``embedded`` are tuned for the embedded tiny model (learning rates, the LoRA shape, the
engine's dtype) and apply only when the run's model is one (:func:`is_embedded_model`): a real model keeps the
trainer's own defaults instead of rates tuned for a 1.2M-parameter model. The rest (steps, batch shape,
evaluation cadence, the time cap, the context) is the environment's and applies to every model.

Its trainer values are for a LoRA adapter. A full-weight run (``trainer.lora = false``) gets the preset's
``full`` values over them (say a full-weight learning rate, and more steps where a step costs less), and a
``trainer.lr`` of :data:`FULL_WEIGHTS_LR` when neither the preset's ``full`` values nor the run set one
(there may be no preset): see :func:`preset_for`, the one place this rule lives.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.config.trainer import LORA_LR_SCALE

FULL_WEIGHTS_LR = 1e-5
"""AdamW learning rate of a full-weight run that sets no ``trainer.lr`` and whose preset's ``full`` values
set none (``trainer.lr``'s own default, 2e-4, is a LoRA rate: far too high for every weight)."""


EMBEDDED_DTYPE = "float32"
"""The engine's dtype for the embedded tiny model: its own, the trainer's. vLLM's ``auto`` casts a float32
checkpoint to 16 bits, which on a CPU without bfloat16 instructions falls back to slow kernels: on a 2-core
AMD EPYC (AVX2 only) the engine generated 1510 to 1610 tokens/s in float32 against 510 to 600 with ``auto``
(128 requests of 40 tokens, side by side); and the sampled logprobs then differ from the trainer's."""


CALC_FULL_LR = 4e-4
"""The full-weight peak learning rate of the embedded model on ``calc`` (lr 5e-4 and 8e-4 learned worse, 2e-4 no
better; docs/training.md)."""


def calc_tiny() -> dict[str, Any]:
    """``calc`` with the embedded tiny model on CPU, capped at 20 minutes on 2 cores (``make train``).

    One schedule for both paths: a peak rate decayed along a half cosine to a tenth of it at the last step.
    The LoRA adapter (rank 16, alpha 32, every linear layer and the tied output layer,
    ``trainer.lora_train_unembed``) peaks at ``LORA_LR_SCALE`` times the full-weight rate, 2e-3; nothing is
    trained whole, so the engines serve it from their LoRA slots and each sync is an in-place copy. Full
    weights (``--full``) peak at 4e-4. Measured in docs/training.md: on seeds 204-206, side by side in one
    sitting, the output layer's LoRA gained more than the earlier recipe (the tied embedding trained whole,
    served merged), in shorter steps; the adapter on the linear layers alone had reached 0.74x and 0.79x of
    full weights' gain on seeds 201-203, the rest carried by the output layer it did not reach."""
    schedule = {"lr_schedule": "cosine", "lr_min_ratio": 0.1}
    return {
        "steps": 80,
        "tasks_per_step": 16,
        "group_size": 8,
        "eval_every": 20,
        "eval_size": 200,
        "checkpoint_every": 10,
        "time_limit_min": 20.0,
        "inference": {"max_model_len": 1024},
        "sampling": {"max_context_tokens": 1024},
        "embedded": {
            "trainer": {"lr": CALC_FULL_LR * LORA_LR_SCALE, "lora_rank": 16, "lora_alpha": 32.0,
                        "lora_train_unembed": True, **schedule},
            "full": {"trainer": {"lr": CALC_FULL_LR, "lora_train_unembed": False, **schedule}},
            "inference": {"dtype": EMBEDDED_DTYPE},
        },
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
        "inference": {"max_model_len": 2048},
        "sampling": {"max_context_tokens": 2048},
        "embedded": {"trainer": {"lr": 1e-3, "lora_rank": 8, "lora_alpha": 16.0}, "inference": {"dtype": EMBEDDED_DTYPE}},
    }


PRESETS: dict[str, Callable[[], dict[str, Any]]] = {"calc": calc_tiny, "swe": swe_tiny}
"""Environment name -> preset."""


def is_embedded_model(model: str | Path) -> bool:
    """Whether ``model`` is a directory of agentrl's embedded tiny model (the pinned one, a rebuild, or a copy
    of either): its marker file records the tiny model's build."""
    try:
        marker = json.loads((Path(model) / "agentrl_model.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and isinstance(marker.get("config"), dict) and "shape" in marker["config"]


def preset_for(env: str, *, full_weights: bool = False, embedded: bool = True) -> dict[str, Any]:
    """The preset values for ``env`` (empty when it has none), as config settings. Its ``embedded`` values
    apply only to the embedded tiny model (``embedded``). A preset's ``full`` values are not settings: for a
    full-weight run (``full_weights``) they go over the others, with ``trainer.lr`` defaulting to
    :data:`FULL_WEIGHTS_LR`; otherwise they are dropped. Values set in a TOML file or by a flag override
    these."""
    fn = PRESETS.get(env)
    values = fn() if fn else {}
    tuned = values.pop("embedded", {})
    if embedded:
        values = deep_update(values, tuned)
    full = values.pop("full", {})
    if full_weights:
        values = deep_update(deep_update(values, {"trainer": {"lr": FULL_WEIGHTS_LR}}), full)
    return values


WHOLE = ("lora_train_embedding", "lora_train_norms")
"""Tensors trained whole beside an adapter, which the engines serve merged: they exclude an output-layer LoRA."""


def yielding(preset: dict[str, Any], given: dict[str, Any], moe: bool = False) -> dict[str, Any]:
    """``preset`` less its output-layer LoRA (``trainer.lora_train_unembed``) where the settings ``given`` over it
    (a file, flags, a saved policy's) say nothing of the output layer and train the embedding or the norms
    whole, or ask for the ``merged`` transport, or the model is a mixture of experts (``moe``: the CPU build's
    slots cannot serve it): those are served merged, the output layer's LoRA from the slots, so the preset's
    choice gives way."""
    trainer = given.get("trainer") if isinstance(given.get("trainer"), dict) else {}
    sync = (given.get("pipeline") or {}).get("weight_sync") if isinstance(given.get("pipeline"), dict) else None
    merged = moe or sync == "merged" or (isinstance(sync, dict) and sync.get("transport") == "merged")
    if "lora_train_unembed" in trainer or not (merged or any(trainer.get(k) for k in WHOLE)):
        return preset
    tuned = dict(preset.get("trainer", {}))
    tuned.pop("lora_train_unembed", None)
    return {**preset, "trainer": tuned}


def set_dotted(table: dict[str, Any], setting: str, value: Any) -> None:
    """Set the dotted ``setting`` (``trainer.loss.kl_coef``) to ``value`` in the nested ``table``, making the
    tables on the way."""
    *tables, last = setting.split(".")
    for name in tables:
        table = table.setdefault(name, {})
    table[last] = value


def deep_update(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` on top, tables merged key by key (the one merge of config layers)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_update(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
