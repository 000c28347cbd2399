"""Sampling-mask replay: the trainer scores each sampled token under the distribution the engine sampled from.

With top-k, top-p or min-p the engine samples from its distribution renormalised over the tokens it kept, and
reports that logprob (:mod:`agentrl.core.masks`). The trainer renormalises its own distribution over the same
recorded set before taking the logprob (logits outside the set are ``-inf`` before the logsumexp), so ratios,
importance weights and the loss compare one distribution on both sides, and the gradient flows only through
the kept logits. Positions the engine did not cut are scored over the whole vocabulary, as without masks.

In a batch the masks travel as ``kept_M_V`` (bool: the kept sets of the micro-batch's ``M`` masked positions)
and a row index per position (``kept_row_B_T`` padded, ``kept_row_P`` packed; -1: no mask), built here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from agentrl.core.types import TrainSample
from agentrl.trainer.errors import BatchError


def collate_kept(samples: Sequence[TrainSample], T: int) -> dict[str, Tensor]:
    """``kept_row_B_T`` and ``kept_M_V`` of ``samples`` padded to ``T`` positions; empty when none has a
    mask."""
    masked = [s.sampling_mask for s in samples if s.sampling_mask is not None and s.sampling_mask.masked]
    if not masked:
        return {}
    vocabs = {m.vocab for m in masked}
    if len(vocabs) > 1:
        raise BatchError(f"samples of one batch have sampling masks over different vocabularies {sorted(vocabs)}")
    rows_B_T = torch.full((len(samples), T), -1, dtype=torch.long)
    sets = []
    for b, s in enumerate(samples):
        if s.sampling_mask is None:
            continue
        for t, kept in s.sampling_mask.rows():
            rows_B_T[b, t] = len(sets)
            sets.append(torch.from_numpy(kept))
    return {"kept_row_B_T": rows_B_T, "kept_M_V": torch.stack(sets)}


def pack_kept(out: dict[str, Tensor]) -> None:
    """Add ``kept_row_P`` (the packed row's mask index per position) to a packed batch that has
    ``kept_row_B_T``, through its ``unpack_B_T``; drop the padded index."""
    rows_B_T = out.pop("kept_row_B_T", None)
    if rows_B_T is None:
        return
    rows_P = torch.full((out["input_ids_1_P"].shape[1],), -1, dtype=torch.long)
    has = rows_B_T >= 0
    rows_P[out["unpack_B_T"][has]] = rows_B_T[has]
    out["kept_row_P"] = rows_P


def mask_logits(logits_N_V: Tensor, rows_N: Tensor | None, kept_M_V: Tensor | None) -> Tensor:
    """``logits_N_V`` with ``-inf`` outside the recorded kept set of every row that has one (``rows_N[i]``:
    an index into ``kept_M_V``, -1 for none); the input itself when there is nothing to mask."""
    if rows_N is None or kept_M_V is None:
        return logits_N_V
    has = rows_N >= 0
    if not bool(has.any()):
        return logits_N_V
    if kept_M_V.shape[1] != logits_N_V.shape[1]:
        raise BatchError(f"sampling masks over a {kept_M_V.shape[1]}-token vocabulary for logits of "
                         f"{logits_N_V.shape[1]}: the engine served another model")
    drop_N_V = torch.zeros(logits_N_V.shape, dtype=torch.bool, device=logits_N_V.device)
    drop_N_V[has] = ~kept_M_V[rows_N[has]].to(logits_N_V.device)
    return logits_N_V.masked_fill(drop_N_V, float("-inf"))
