"""Device placement settings (``[placement]``), pure pydantic: the planner is :mod:`agentrl.launch.placement`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

_LIST = r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$"


class PlacementConfig(BaseModel):
    """Where the processes this run starts go. Empty lists: an automatic split (see :func:`plan_run`)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    inference_gpus: str | None = Field(None, pattern=_LIST)
    """GPUs for the local vLLM servers (``"0-3"``): consecutive groups of ``inference.tensor_parallel_size``
    devices, one server per group. Indices into the GPUs this process sees."""
    trainer_gpus: str | None = Field(None, pattern=_LIST)
    """GPUs for the trainer (``"4-7"``): one torchrun rank per device, so ``nproc`` is their number."""
