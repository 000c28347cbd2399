"""Device placement settings (``[placement]``), pure pydantic: the planner is :mod:`agentrl.launch.placement`."""

from __future__ import annotations

from pydantic import Field

from agentrl.config.base import Section

_LIST = r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$"


class PlacementConfig(Section):
    """Where the processes this run starts go. Empty lists: an automatic split (see :func:`plan_run`)."""

    inference_gpus: str | None = Field(None, pattern=_LIST)
    """GPUs for the local vLLM servers (``"0-3"``): consecutive groups of ``inference.tensor_parallel_size``
    devices, one server per group. Indices into the GPUs this process sees."""
    trainer_gpus: str | None = Field(None, pattern=_LIST)
    """GPUs for the trainer (``"4-7"``): one torchrun rank per device, so ``nproc`` is their number."""
