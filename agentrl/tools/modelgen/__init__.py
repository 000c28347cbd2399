"""The embedded tiny model: a byte-level BPE tokenizer with a tool-calling chat template and a small
Qwen2 model (or, with `MOE_SHAPE`, a Qwen3-MoE model), built deterministically from a seed and warmed up
on calc episodes. The built models ship with agentrl, and a run installs them (`agentrl.launch.pinned`, a
runtime part): every machine starts from the same weights. This package is the recipe.

    from agentrl.tools.modelgen import DEFAULT_TINY_DIR, ensure_embedded
    model_dir = ensure_embedded(DEFAULT_TINY_DIR)  # copies the pinned model in; a no-op when it is there
    rebuilt = build_tiny_model(Path("models/tiny-rebuilt"))  # the recipe itself (minutes; differs by CPU)
"""

from agentrl.launch.pinned import (
    DEFAULT_TINY_DIR,
    DEFAULT_TINY_MOE_DIR,
    EMBEDDED,
    TINY,
    TINY_MOE,
    PinnedModel,
    embedded_model,
    ensure_embedded,
    install_pinned,
    read_marker,
)
from agentrl.tools.modelgen.tiny import DEFAULT_WARMUP_STEPS, MOE_SHAPE, ModelShape, build_tiny_model

__all__ = [
    "DEFAULT_TINY_DIR",
    "DEFAULT_TINY_MOE_DIR",
    "DEFAULT_WARMUP_STEPS",
    "EMBEDDED",
    "MOE_SHAPE",
    "TINY",
    "TINY_MOE",
    "ModelShape",
    "PinnedModel",
    "build_tiny_model",
    "embedded_model",
    "ensure_embedded",
    "install_pinned",
    "read_marker",
]
