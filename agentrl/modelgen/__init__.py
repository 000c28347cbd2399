"""The embedded tiny model: a byte-level BPE tokenizer with a tool-calling chat template and a small
Qwen2 model, built deterministically from a seed and warmed up on calc episodes.

    from agentrl.modelgen import DEFAULT_TINY_DIR, build_tiny_model
    model_dir = build_tiny_model(DEFAULT_TINY_DIR)  # no-op when already built with the same config
"""

from pathlib import Path

from agentrl.modelgen.tiny import DEFAULT_WARMUP_STEPS, ModelShape, build_tiny_model, read_marker

DEFAULT_TINY_DIR = Path("models/tiny")
"""Where the tiny model is built by default (relative to the current directory)."""

__all__ = ["DEFAULT_TINY_DIR", "DEFAULT_WARMUP_STEPS", "ModelShape", "build_tiny_model", "read_marker"]
