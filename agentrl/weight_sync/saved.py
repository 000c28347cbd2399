"""A saved peft adapter as a publisher's source: what an evaluation publishes through the run's transport in
place of the trainer, and whether it carries tensors trained whole (which decides the transport).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class AdapterDirectory:
    """A saved adapter (``adapter_config.json``, ``adapter_model.safetensors``) standing in for the trainer of any
    adapter transport: how an evaluation publishes a trained adapter, into a LoRA slot or merged."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    async def get_adapter_tensors(self) -> dict[str, Any]:
        from safetensors.torch import load_file

        return load_file(str(self.path / "adapter_model.safetensors"))

    async def save_adapter(self, path: str | Path) -> dict[str, Any]:
        import shutil

        shutil.copytree(self.path, path, dirs_exist_ok=True)
        return {"path": str(path)}


def carries_whole_tensors(adapter: str | Path) -> bool:
    """Whether a saved adapter also carries tensors trained whole (trained norms, peft's ``modules_to_save``;
    a trained embedding), which vLLM's LoRA slots cannot serve: it is served merged."""
    from safetensors import safe_open

    config = json.loads((Path(adapter) / "adapter_config.json").read_text())
    weights = Path(adapter) / "adapter_model.safetensors"
    if config.get("modules_to_save") or not weights.is_file():  # an older peft's .bin: vLLM reads it as it is
        return bool(config.get("modules_to_save"))
    with safe_open(str(weights), framework="pt") as f:
        return any(".lora_" not in k for k in f.keys())


def carries_output_lora(adapter: str | Path) -> bool:
    """Whether a saved adapter has a LoRA on the output layer (``trainer.lora_train_unembed``, Tinker's
    ``train_unembed``): its engines must wrap ``lm_head`` too, and it is served from the slots."""
    from agentrl.config.trainer import OUTPUT_LAYER

    weights = Path(adapter) / "adapter_model.safetensors"
    if not weights.is_file():  # an older peft's .bin: its config's target names say
        targets = json.loads((Path(adapter) / "adapter_config.json").read_text()).get("target_modules") or []
        return OUTPUT_LAYER in ([targets] if isinstance(targets, str) else targets)
    from safetensors import safe_open

    with safe_open(str(weights), framework="pt") as f:
        return any(f".{OUTPUT_LAYER}.lora_" in k for k in f.keys())
