"""The MoE routing record (`agentrl.core.types.Routing`): rows, version spans, size checks, JSON round trip."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from agentrl.core.types import Routing, TrainSample, Trajectory


def rows(m: int, layers: int = 2, top_k: int = 3, dtype: str = "uint8", base: int = 0) -> np.ndarray:
    return (np.arange(m * layers * top_k).reshape(m, layers, top_k) + base).astype(dtype)


def test_extend_appends_rows_and_merges_version_spans() -> None:
    r = Routing(layers=2, top_k=3)
    assert (r.n, r.versions, r.array().shape) == (0, [], (0, 2, 3))
    a, b, c = rows(3), rows(2, base=50), rows(4, base=100)
    r.extend(a, [5, 5, 5])
    r.extend(b, [5, 6])  # the first row continues span 5, the second opens span 6 at position 4
    r.extend(c, [6, 6, 5, 5])  # continues 6, then a version going back opens its own span
    assert r.n == 9
    assert r.versions == [(0, 5), (4, 6), (7, 5)]
    np.testing.assert_array_equal(r.array(), np.concatenate([a, b, c]))
    assert r.array().dtype == np.uint8
    r.extend(rows(0), [])  # nothing to add
    assert (r.n, r.versions) == (9, [(0, 5), (4, 6), (7, 5)])


def test_row_bytes_and_n_per_dtype() -> None:
    r8 = Routing(layers=4, top_k=2)
    r16 = Routing(layers=4, top_k=2, dtype="uint16")
    assert (r8.row_bytes, r16.row_bytes) == (8, 16)
    r16.extend(rows(3, 4, 2, "uint16", base=300), [0, 0, 0])
    assert (r16.n, len(r16.ids)) == (3, 48)
    np.testing.assert_array_equal(r16.array(), rows(3, 4, 2, "uint16", base=300))
    assert int(r16.array().max()) > 255


def test_extend_refuses_other_shapes_dtypes_and_version_counts() -> None:
    r = Routing(layers=2, top_k=3)
    for bad in (rows(2, layers=3), rows(2, top_k=2), rows(2, dtype="uint16"), rows(2).astype(np.int64)):
        with pytest.raises(ValueError, match="do not extend"):
            r.extend(bad, [0, 0])
    with pytest.raises(ValueError, match="versions"):
        r.extend(rows(2), [0])
    assert (r.n, r.versions) == (0, [])


def test_check_positions_and_ragged_bytes() -> None:
    r = Routing(layers=2, top_k=3)
    r.check(0)  # empty fits anything
    r.extend(rows(4), [0] * 4)
    r.check(5)  # at most seq_len - 1 positions
    r.check(100)
    with pytest.raises(ValueError, match="covers 4 positions"):
        r.check(4)
    with pytest.raises(ValueError, match="covers 4 positions"):
        r.check(0)
    ragged = Routing(layers=2, top_k=3, ids=b"\x00" * 7)
    with pytest.raises(ValueError, match="whole number"):
        ragged.check(100)


def traj_with(routing: Routing | None, prompt: int = 3, completion: int = 3) -> Trajectory:
    return Trajectory(task_id="t", env="e", prompt_ids=list(range(prompt)), completion_ids=[7] * completion,
                      loss_mask=[1] * completion, logprobs=[-0.1] * completion, versions=[2] * completion,
                      routing=routing)


def test_trajectory_json_round_trip_keeps_bytes_and_spans() -> None:
    r = Routing(layers=2, top_k=3, dtype="uint16")
    # bytes that base64-encode to '+' and '/' in the standard alphabet ('-' and '_' url-safe)
    data = np.array([0xFBFF, 0xFFFB, 0x3E3F, 1, 2, 3] * 5, dtype=np.uint16).reshape(5, 2, 3)
    r.extend(data, [1, 1, 2, 2, 3])
    traj = traj_with(r)
    text = traj.model_dump_json()
    raw = json.loads(text)["routing"]
    assert isinstance(raw["ids"], str)
    assert base64.urlsafe_b64decode(raw["ids"]) == r.ids  # pydantic writes the url-safe alphabet
    back = Trajectory.model_validate_json(text)
    assert back.routing is not None
    assert back.routing.ids == r.ids and back.routing.dtype == "uint16"
    assert back.routing.versions == [(0, 1), (2, 2), (4, 3)]
    np.testing.assert_array_equal(back.routing.array(), data)
    back.check()
    # no routing stays None
    assert Trajectory.model_validate_json(traj_with(None).model_dump_json()).routing is None


def test_trajectory_check_checks_routing() -> None:
    r = Routing(layers=2, top_k=3)
    r.extend(rows(5), [0] * 5)
    traj_with(r, prompt=3, completion=3).check()  # 6 tokens, 5 positions
    with pytest.raises(ValueError, match="covers 5 positions"):
        traj_with(r, prompt=3, completion=2).check()


def test_train_sample_refuses_routing_past_the_last_fed_position() -> None:
    def sample(n_routed: int) -> TrainSample:
        r = Routing(layers=2, top_k=3)
        r.extend(rows(n_routed), [0] * n_routed)
        return TrainSample(input_ids=[1, 2, 3, 4], loss_mask=[0, 0, 1, 1], behav_logprobs=[0, 0, -1, -1],
                           advantage=1.0, versions=[-1, -1, 0, 0], routing=r)

    assert sample(3).routing.n == 3
    with pytest.raises(ValueError, match="covers 4 positions"):
        sample(4)
