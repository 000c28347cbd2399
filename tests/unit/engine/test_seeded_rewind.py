"""Patch 15's logic on a stand-in runner with real CPU generators: vLLM's offset rewind of a discarded sample
raises on a CPU generator; the wrapped runner undoes the discarded draws on the generator's state instead."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from agentrl.engine.vllm_patches import rewind_discarded_draws


class Runner:
    """The parts of vLLM's model runner that patch 15 touches: sampling draws from each seeded row's
    generator; bookkeeping rewinds the generators of discarded rows by offset (as vLLM 0.32 does)."""

    def __init__(self, seeds: dict[int, int], n: int) -> None:
        gens = {i: torch.Generator().manual_seed(s) for i, s in seeds.items()}
        self.input_batch = SimpleNamespace(generators=gens, num_reqs=n)
        self.discard_request_mask = SimpleNamespace(np=np.zeros(8, dtype=bool))

    def _sample(self) -> dict[int, float]:
        return {i: float(torch.rand(16, generator=g).sum()) for i, g in self.input_batch.generators.items()}

    def _bookkeeping_sync(self) -> None:
        for i in self.discard_request_mask.np[:self.input_batch.num_reqs].nonzero()[0]:
            gen = self.input_batch.generators.get(int(i))
            if gen is not None:
                gen.set_offset(gen.get_offset() - 4)

    def step(self, discard: list[int]) -> dict[int, float]:
        self.discard_request_mask.np[:] = False
        self.discard_request_mask.np[discard] = True
        out = self._sample()
        self._bookkeeping_sync()
        return out


def test_vllms_offset_rewind_raises_on_a_cpu_generator() -> None:
    with pytest.raises(RuntimeError, match="offset"):
        Runner({0: 1}, 1).step(discard=[0])


def test_discarded_draws_are_undone_and_kept_draws_are_not() -> None:
    class Patched(Runner):
        pass

    rewind_discarded_draws(Patched)
    rewind_discarded_draws(Patched)  # idempotent
    plain, split = Runner({0: 1, 2: 5}, 3), Patched({0: 1, 2: 5}, 3)
    first = plain.step(discard=[])
    assert split.step(discard=[0, 1]) == first  # row 0's prefill is split: its sample is thrown away
    assert split.input_batch.generators.keys() == {0, 2}  # hidden from bookkeeping only
    second = plain.step(discard=[])
    again = split.step(discard=[])
    assert again[0] == first[0]  # the discarded draw left no trace: row 0 samples as if it came now
    assert again[2] == second[2]  # row 2 kept its sample and moved on
