"""A one-rank gloo world for tests that run the trainer's step in-process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    store = tmp_path_factory.mktemp("pg") / "store"
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"  # CUDA variants run where they can
    dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
