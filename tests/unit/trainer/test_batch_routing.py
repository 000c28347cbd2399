"""`collate`'s MoE routing tensor: the recorded rows, -1 wherever a position has none."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentrl.core.types import Routing, TrainSample
from agentrl.trainer.batch import collate


def routing(n: int, layers: int = 2, top_k: int = 3, dtype: str = "uint8", base: int = 0) -> Routing:
    r = Routing(layers=layers, top_k=top_k, dtype=dtype)  # type: ignore[arg-type]
    r.extend((np.arange(n * layers * top_k).reshape(n, layers, top_k) + base).astype(dtype), [0] * n)
    return r


def sample(length: int, r: Routing | None = None) -> TrainSample:
    return TrainSample(input_ids=list(range(1, length + 1)), loss_mask=[0] + [1] * (length - 1),
                       behav_logprobs=[0.0] + [-0.5] * (length - 1), advantage=1.0,
                       versions=[-1] + [0] * (length - 1), routing=r)


def test_routing_rows_and_minus_one_elsewhere() -> None:
    full, partial = routing(5), routing(2, base=100)
    batch = collate([sample(6, full), sample(4), sample(3, partial), sample(4, routing(0))], pad_id=0)
    out = batch["routing_B_T_L_K"]
    assert out.dtype == torch.long and out.shape == (4, 6, 2, 3)
    assert torch.equal(out[0, :5], torch.from_numpy(full.array().astype(np.int64)))
    assert (out[0, 5:] == -1).all()  # the last token, never fed forward
    assert (out[1] == -1).all()  # no routing
    assert torch.equal(out[2, :2], torch.from_numpy(partial.array().astype(np.int64)))
    assert (out[2, 2:] == -1).all()  # past routing.n, and padding
    assert (out[3] == -1).all()  # an empty record
    assert batch["input_ids_B_T"].shape == (4, 6)


def test_uint16_ids_keep_their_values() -> None:
    r = routing(3, dtype="uint16", base=400)
    out = collate([sample(4, r)], pad_id=0)["routing_B_T_L_K"]
    assert int(out[0, :3].min()) == 400 and torch.equal(out[0, :3], torch.from_numpy(r.array().astype(np.int64)))
    assert (out[0, 3] == -1).all()


def test_no_routing_no_key() -> None:
    batch = collate([sample(3), sample(5)], pad_id=0)
    assert "routing_B_T_L_K" not in batch


def test_mixed_shapes_raise() -> None:
    with pytest.raises(ValueError, match="different shapes"):
        collate([sample(4, routing(2)), sample(4, routing(2, layers=3))], pad_id=0)
    with pytest.raises(ValueError, match="different shapes"):
        collate([sample(4, routing(2)), sample(4), sample(4, routing(2, top_k=2))], pad_id=0)


def test_packed_routing_follows_the_row() -> None:
    from agentrl.trainer.packing import collate_packed

    full, partial = routing(5), routing(2, base=100)
    samples = [sample(6, full), sample(4), sample(3, partial)]
    batch = collate_packed(samples, pad_id=0)
    assert "routing_B_T_L_K" not in batch
    row = batch["routing_1_P_L_K"]
    assert row.shape == (1, 13, 2, 3)
    padded = collate(samples, pad_id=0)["routing_B_T_L_K"]
    for b, (start, n) in enumerate([(0, 6), (6, 4), (10, 3)]):
        assert torch.equal(row[0, start : start + n], padded[b, :n])
