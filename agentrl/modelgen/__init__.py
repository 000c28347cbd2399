"""The embedded tiny model: a byte-level BPE tokenizer with a tool-calling chat template and a small
Qwen2 model (or, with `MOE_SHAPE`, a Qwen3-MoE model), built deterministically from a seed and warmed up
on calc episodes.

    from agentrl.modelgen import DEFAULT_TINY_DIR, DEFAULT_TINY_MOE_DIR, MOE_SHAPE, build_tiny_model
    model_dir = build_tiny_model(DEFAULT_TINY_DIR)  # no-op when already built with the same config
    moe_dir = build_tiny_model(DEFAULT_TINY_MOE_DIR, shape=MOE_SHAPE)
"""

from pathlib import Path

from agentrl.modelgen.tiny import DEFAULT_WARMUP_STEPS, MOE_SHAPE, ModelShape, build_tiny_model, read_marker

DEFAULT_TINY_DIR = Path("models/tiny")
"""Where the tiny model is built by default (relative to the current directory)."""

DEFAULT_TINY_MOE_DIR = Path("models/tiny-moe")
"""Where the tiny MoE model (`MOE_SHAPE`) is built by default (relative to the current directory)."""

__all__ = [
    "DEFAULT_TINY_DIR",
    "DEFAULT_TINY_MOE_DIR",
    "DEFAULT_WARMUP_STEPS",
    "MOE_SHAPE",
    "ModelShape",
    "build_tiny_model",
    "read_marker",
]
