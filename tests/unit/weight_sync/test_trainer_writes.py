"""The shared-memory publisher asks a trainer that can to write the adapter into its segment: not before the
segment is laid out, each publish while the trainer writes, and, once it declined (several ranks), not again
until the layout changes."""

from __future__ import annotations

from typing import Any

import torch

from agentrl.weight_sync.shm import SharedMemoryAdapterSync


class _Trainer:
    def __init__(self, writes: bool) -> None:
        self.writes, self.asked = writes, 0

    async def get_adapter_tensors(self) -> dict[str, torch.Tensor]:
        return {"m.lora_A.weight": torch.ones(2, 4), "m.lora_B.weight": torch.ones(4, 2)}

    async def write_adapter(self, layout: list[Any], shm_name: str, segment_bytes: int,
                            b_scale: float | None) -> dict[str, Any]:
        self.asked += 1
        return {"written": self.writes}


async def _asks(writes: bool) -> list[bool]:
    trainer = _Trainer(writes)
    with SharedMemoryAdapterSync(trainer, engine=None, name="a") as sync:  # type: ignore[arg-type]
        out = [await sync._trainer_writes()]  # no segment yet: not asked
        sync.write(await trainer.get_adapter_tensors())
        out += [await sync._trainer_writes(), await sync._trainer_writes()]
        sync.write({"m.lora_A.weight": torch.ones(3, 4), "m.lora_B.weight": torch.ones(4, 3)})  # a new layout
        out.append(await sync._trainer_writes())
    return [*out, trainer.asked]


async def test_a_trainer_that_writes_is_asked_at_each_publish() -> None:
    assert await _asks(True) == [False, True, True, True, 3]


async def test_a_trainer_that_declined_is_asked_again_only_for_a_new_layout() -> None:
    assert await _asks(False) == [False, False, False, False, 2]
