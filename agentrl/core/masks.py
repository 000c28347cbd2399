"""Sampling masks: which tokens the engine's processed distribution kept at each sampled position.

With top-k, top-p or min-p the engine samples from a truncated distribution, renormalised over the tokens it
kept, and reports that distribution's logprob. The trainer must score the same distribution (renormalise its
own over the same set), or its ratios and importance weights compare two different things. Off-policy the
trainer cannot recompute the set from its own logits (its weights are newer), so the engine records it.

Each sampled position keeps ``count`` tokens of a ``vocab``-token vocabulary (``count = 0``: nothing was cut,
the whole vocabulary). Its set is stored in the smallest exact form, chosen from ``count`` alone, so no kind
tag is needed:

* the kept ids, sorted (``count`` ids);
* the dropped ids, sorted (``vocab - count`` ids), when fewer;
* a bitmap of the vocabulary (``ceil(vocab / 8)`` bytes, little bit order), when smaller than either.

Ids are ``uint16`` for vocabularies up to 65,536 tokens, else ``uint32``. The engine's worker encodes, the
trainer decodes; numpy is imported where it is used (the CLI loads this module through the trajectory types).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentrl.core.errors import AgentRLError

if TYPE_CHECKING:
    import numpy as np


class SamplingMaskError(AgentRLError, ValueError):
    """A sampling mask does not fit: its bytes do not match its counts, or it does not cover the tokens it
    describes."""

    code = "trajectory.sampling_mask"


def id_width(vocab: int) -> int:
    """Bytes per token id for a vocabulary of ``vocab`` tokens."""
    return 2 if vocab <= 1 << 16 else 4


def row_form(count: int, vocab: int) -> tuple[Literal["all", "kept", "dropped", "bitmap"], int]:
    """How a position that kept ``count`` of ``vocab`` tokens is stored, and its bytes."""
    if count == 0:
        return "all", 0
    w, bitmap = id_width(vocab), (vocab + 7) // 8
    kept, dropped = count * w, (vocab - count) * w
    if kept <= dropped and kept <= bitmap:
        return "kept", kept
    if dropped <= bitmap:
        return "dropped", dropped
    return "bitmap", bitmap


def encode_row(kept: Any, vocab: int) -> tuple[int, bytes]:
    """``(count, bytes)`` of one position whose kept tokens are the true entries of ``kept`` (a bool array of
    ``vocab`` entries); ``count`` 0 when every token was kept."""
    import numpy as np

    kept = np.asarray(kept, dtype=bool)
    if kept.shape != (vocab,):
        raise SamplingMaskError(f"a mask row of shape {kept.shape} for a {vocab}-token vocabulary")
    count = int(kept.sum())
    if count == vocab:
        return 0, b""
    if count == 0:
        raise SamplingMaskError("a sampled position kept no token")
    form, _ = row_form(count, vocab)
    dtype = np.uint16 if id_width(vocab) == 2 else np.uint32
    if form == "kept":
        return count, np.flatnonzero(kept).astype(dtype).tobytes()
    if form == "dropped":
        return count, np.flatnonzero(~kept).astype(dtype).tobytes()
    return count, np.packbits(kept, bitorder="little").tobytes()


def decode_row(count: int, data: bytes | memoryview, vocab: int) -> np.ndarray:
    """The bool array of ``vocab`` entries that :func:`encode_row` stored as ``(count, data)``."""
    import numpy as np

    form, size = row_form(count, vocab)
    if len(data) != size:
        raise SamplingMaskError(f"a mask row of {count} kept tokens takes {size} bytes, not {len(data)}")
    if form == "all":
        return np.ones(vocab, dtype=bool)
    dtype = np.uint16 if id_width(vocab) == 2 else np.uint32
    if form == "bitmap":
        return np.unpackbits(np.frombuffer(data, np.uint8), count=vocab, bitorder="little").astype(bool)
    ids = np.frombuffer(data, dtype).astype(np.int64)
    if len(ids) and int(ids.max()) >= vocab:
        raise SamplingMaskError(f"a mask row names token {int(ids.max())} of a {vocab}-token vocabulary")
    out = np.zeros(vocab, dtype=bool) if form == "kept" else np.ones(vocab, dtype=bool)
    out[ids] = form == "kept"
    if int(out.sum()) != count:
        raise SamplingMaskError(f"a mask row says {count} kept tokens but holds {int(out.sum())}")
    return out


class SamplingMask(BaseModel):
    """The sampling masks of a run of positions (see the module docstring): ``counts[i]`` tokens kept at
    position ``i`` (0: the whole vocabulary), their sets concatenated in ``data``.

    On a :class:`~agentrl.core.types.Trajectory` the positions are its ``completion_ids`` (tool and template
    tokens, never sampled, have count 0); on a :class:`~agentrl.core.types.TrainSample` its ``input_ids``."""

    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    vocab: int = Field(ge=2)
    """Size of the distribution the engine sampled from (the model's logits, padding included)."""
    counts: list[int] = Field(default_factory=list)
    """Tokens kept at each position; 0: nothing cut."""
    data: bytes = b""
    """The positions' sets, in their stored forms, one after another (base64 in JSON)."""

    @property
    def n(self) -> int:
        """Positions covered."""
        return len(self.counts)

    @property
    def masked(self) -> int:
        """Positions where the engine cut something."""
        return sum(1 for c in self.counts if c)

    def offsets(self) -> np.ndarray:
        """Byte offset of every position's set in ``data``, and the end (``n + 1`` entries)."""
        import numpy as np

        sizes = [row_form(c, self.vocab)[1] for c in self.counts]
        return np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)

    def row(self, i: int) -> np.ndarray:
        """Position ``i``'s kept set, a bool array of ``vocab`` entries."""

        off = self.offsets()
        return decode_row(self.counts[i], memoryview(self.data)[off[i]: off[i + 1]], self.vocab)

    def rows(self) -> list[tuple[int, np.ndarray]]:
        """``(position, kept set)`` of every position where something was cut."""

        off = self.offsets()
        view = memoryview(self.data)
        return [(i, decode_row(c, view[off[i]: off[i + 1]], self.vocab)) for i, c in enumerate(self.counts) if c]

    def extend(self, counts: list[int], data: bytes) -> None:
        """Append positions ``n ..``."""
        want = sum(row_form(c, self.vocab)[1] for c in counts)
        if want != len(data):
            raise SamplingMaskError(f"{len(counts)} mask rows take {want} bytes, not {len(data)}")
        self.counts = [*self.counts, *counts]
        self.data += data

    def pad(self, k: int) -> None:
        """Append ``k`` positions that were not sampled (count 0)."""
        self.counts = [*self.counts, *([0] * k)]

    def head(self, k: int) -> SamplingMask:
        """The masks of the first ``k`` positions (a completion cut after a stop sequence)."""
        end = int(self.offsets()[min(k, self.n)])
        return SamplingMask(vocab=self.vocab, counts=self.counts[:k], data=self.data[:end])

    def shifted(self, k: int) -> SamplingMask:
        """The same masks behind ``k`` unsampled positions (a trajectory's masks laid over its prompt and
        completion)."""
        return SamplingMask(vocab=self.vocab, counts=[0] * k + self.counts, data=self.data)

    def check(self, n: int) -> None:
        """Raise :class:`SamplingMaskError` (a ``ValueError``) unless the masks cover exactly ``n`` positions
        and their bytes match their counts."""
        if self.n != n:
            raise SamplingMaskError(f"sampling masks cover {self.n} positions, not the {n} tokens they describe")
        end = int(self.offsets()[-1])
        if end != len(self.data):
            raise SamplingMaskError(f"sampling masks of these counts take {end} bytes, not {len(self.data)}")

    def bytes_per_token(self) -> float:
        """Stored bytes per position (counts as 4 bytes each, plus the sets)."""
        return (4 * self.n + len(self.data)) / max(1, self.n)
