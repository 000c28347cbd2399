"""The old import path of agentrl's vLLM worker extension, kept so that ``--worker-extension-cls
agentrl.inference.lora_ext.LoRAInPlaceExtension`` (in users' configs and launch scripts) still loads it. The
extension is :class:`agentrl.engine.extension.WorkerExtension`; nothing is defined here."""

from agentrl.engine.extension import WorkerExtension

LoRAInPlaceExtension = WorkerExtension
"""The extension's name before it lived in :mod:`agentrl.engine`."""

__all__ = ["LoRAInPlaceExtension", "WorkerExtension"]
