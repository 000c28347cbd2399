"""The embedded tiny model: a byte-level BPE tokenizer with a tool-calling chat template and a small
Qwen2 model (or, with `MOE_SHAPE`, a Qwen3-MoE model), built deterministically from a seed and warmed up
on calc episodes. The built models ship with agentrl (`agentrl.tools.modelgen.pinned`): every machine starts from
the same weights.

    from agentrl.tools.modelgen import DEFAULT_TINY_DIR, ensure_embedded
    model_dir = ensure_embedded(DEFAULT_TINY_DIR)  # copies the pinned model in; a no-op when it is there
    rebuilt = build_tiny_model(Path("models/tiny-rebuilt"))  # the recipe itself (minutes; differs by CPU)
"""

from pathlib import Path

from agentrl.tools.modelgen.pinned import TINY, TINY_MOE, PinnedModel, install_pinned
from agentrl.tools.modelgen.tiny import (
    DEFAULT_WARMUP_STEPS,
    MOE_SHAPE,
    ModelShape,
    build_tiny_model,
    read_marker,
)

DEFAULT_TINY_DIR = Path("models/tiny")
"""Where the tiny model is installed by default (relative to the current directory)."""

DEFAULT_TINY_MOE_DIR = Path("models/tiny-moe")
"""Where the tiny MoE model (`MOE_SHAPE`) is installed by default (relative to the current directory)."""

EMBEDDED: dict[Path, PinnedModel] = {DEFAULT_TINY_DIR: TINY, DEFAULT_TINY_MOE_DIR: TINY_MOE}
"""Default directory -> the pinned model it holds."""


def embedded_model(directory: str | Path) -> PinnedModel | None:
    """The pinned model that ``directory`` holds by default (it is ``models/tiny`` or ``models/tiny-moe``,
    relative to the current directory), else None."""
    resolved = Path(directory).resolve()
    return next((m for d, m in EMBEDDED.items() if d.resolve() == resolved), None)


def ensure_embedded(directory: str | Path) -> Path:
    """Install the pinned model of a default directory (a no-op when it is in place) and return the
    directory; any other directory is returned as it is."""
    model = embedded_model(directory)
    return install_pinned(Path(directory), model) if model is not None else Path(directory)


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
