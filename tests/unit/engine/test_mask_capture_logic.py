"""The engine-side mask capture's bookkeeping, on processed logprobs made by hand: one row per sampled token of
each request, discarded samples (a split prefill) skipped, count 0 where nothing was cut, a paused capture
recording nothing, and a take that hands a request's masks over once."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from agentrl.core.masks import SamplingMask
from agentrl.engine import masks as engine_masks
from agentrl.engine.masks import MaskCapture

V = 50


def _step(monkeypatch: pytest.MonkeyPatch, cap: MaskCapture, rows: list[tuple[str | None, bool, list[int] | None]]
          ) -> None:
    """One sampler call: per batch row its request id, whether vLLM discards its sample, and the kept ids (None:
    nothing cut)."""
    processed = torch.zeros(len(rows), V)
    for i, (_, _, kept) in enumerate(rows):
        if kept is not None:
            processed[i] = float("-inf")
            processed[i, kept] = -1.0
    monkeypatch.setattr(engine_masks.vllm_patches, "sampled_rows",
                        lambda runner: ([r for r, _, _ in rows], [d for _, d, _ in rows]))
    cap.on_sample(object(), processed)


def _mask(held: Any) -> SamplingMask:
    mask = SamplingMask(vocab=V)
    mask.extend(held.counts, bytes(held.data))
    return mask


def test_each_request_keeps_one_row_per_kept_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    cap = MaskCapture()
    _step(monkeypatch, cap, [("a-1", False, [3, 4]), ("b-2", True, [1]), (None, False, [0])])  # b: split prefill
    _step(monkeypatch, cap, [("a-1", False, None), ("b-2", False, [7, 8, 9])])
    cap.active = False
    _step(monkeypatch, cap, [("a-1", False, [5])])  # paused: not recorded
    cap.active = True
    _step(monkeypatch, cap, [("a-1", False, [2])])
    a = _mask(cap.take("a"))  # found by a part of its id, as vLLM suffixes the ids it is given
    assert a.counts == [2, 0, 1] and np.flatnonzero(a.row(0)).tolist() == [3, 4] and a.row(2)[2]
    b = _mask(cap.take("b-2"))
    assert b.counts == [3] and np.flatnonzero(b.row(0)).tolist() == [7, 8, 9]
    assert cap.take("a") is None, "taken once"
    assert (cap.rows_seen, cap.rows_cut, cap.vocab) == (4, 3, V)


def test_nothing_is_recorded_without_processed_logprobs(monkeypatch: pytest.MonkeyPatch) -> None:
    cap = MaskCapture()
    cap.on_sample(object(), None)
    assert cap.held == {} and cap.rows_seen == 0
