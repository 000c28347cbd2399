"""The worker-extension path that vLLM servers are started with (``--worker-extension-cls
agentrl.inference.lora_ext.LoRAInPlaceExtension``), kept so that existing commands and configs go on working.
The extension lives in :mod:`agentrl.weight_sync.vllm_ext`."""

from agentrl.weight_sync.vllm_ext import LoRAInPlaceExtension

__all__ = ["LoRAInPlaceExtension"]
