"""How a full-weight sync cuts the model into buckets: pure planning, shared by the trainer (which gathers and
writes one bucket at a time) and the publisher (which streams them into the engines).

A bucket is a :data:`Layout`, the same packed format as the LoRA segment (:func:`agentrl.weight_sync.inplace.pack_layout`):
``(name, dtype, shape, byte offset)`` per tensor, offsets from the bucket's start, each 64-byte aligned. Buckets
follow the model's parameter order (layer by layer), so each one is a few consecutive layers.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentrl.core.errors import ConfigError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per element of the dtypes an engine serves weights in."""
ALIGN = 64

Layout = list[tuple[str, str, list[int], int]]
"""One bucket: (HF parameter name, dtype, shape, byte offset) per tensor."""


class BucketPlanError(ConfigError, ValueError):
    """Full weights cannot be cut into buckets as asked: an engine dtype without a known size, or a bucket
    size that is not positive."""

    code = "config.weight_buckets"


def _nbytes(shape: Sequence[int], dtype: str) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n * DTYPE_BYTES[dtype]


def plan_buckets(specs: Sequence[tuple[str, Sequence[int]]], dtype: str, bucket_bytes: int) -> list[Layout]:
    """Cut ``specs`` (parameter name and full shape, in model order) into buckets of at most ``bucket_bytes``
    in ``dtype`` (a tensor larger than that gets a bucket of its own)."""
    if dtype not in DTYPE_BYTES:
        raise BucketPlanError(f"engine dtype {dtype!r} is not one of {sorted(DTYPE_BYTES)}")
    if bucket_bytes < 1:
        raise BucketPlanError("bucket_bytes must be positive")
    buckets: list[Layout] = []
    cur: Layout = []
    offset = 0
    for name, shape in specs:
        size = -(-_nbytes(shape, dtype) // ALIGN) * ALIGN
        if cur and offset + size > bucket_bytes:
            buckets.append(cur)
            cur, offset = [], 0
        cur.append((name, dtype, [int(d) for d in shape], offset))
        offset += size
    if cur:
        buckets.append(cur)
    return buckets


def layout_bytes(layout: Layout) -> int:
    """Bytes one bucket occupies (its last tensor's end, aligned)."""
    if not layout:
        return 0
    _, dtype, shape, offset = layout[-1]
    return offset + -(-_nbytes(shape, dtype) // ALIGN) * ALIGN


def payload_bytes(buckets: Sequence[Layout]) -> int:
    """State-dict bytes moved per sync (the tensors themselves, without alignment padding)."""
    return sum(_nbytes(shape, dtype) for layout in buckets for _, dtype, shape, _ in layout)
