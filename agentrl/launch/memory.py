"""Trainer memory, estimated from a model's ``config.json`` before anything starts (``agentrl train --dry-run``).

Pure Python (no torch): the parameter count is computed from the config's shapes, for the dense
decoder-only causal LMs agentrl trains (Llama, Qwen2/Qwen3, Mistral and their relatives). Per trainer rank,
with FSDP2 sharding everything the optimizer touches over the ranks:

- full weights (``trainer.lora = false``): fp32 parameters, fp32 gradients and AdamW's two fp32 moments,
  16 bytes per parameter / ranks, plus one gathered weight-sync bucket on rank 0 (the estimate is that
  rank's);
- LoRA: the frozen fp32 base, 4 bytes per parameter / ranks, plus the adapter's 16 bytes per parameter / ranks.

Activations (set by ``trainer.micro_batch_tokens`` and ``trainer.gradient_checkpointing``), the unsharded
layer FSDP gathers for each forward, and the CUDA context are not counted.
"""

from __future__ import annotations

from agentrl.config.trainer import TrainerSettings
from agentrl.core.shape import DecoderShape, read_shape

__all__ = ["DecoderShape", "read_shape", "trainer_bytes_per_rank", "trainer_memory_note"]

FULL_BYTES_PER_PARAM = 4 + 4 + 8
"""fp32 parameter + fp32 gradient + AdamW's two fp32 moments."""
FROZEN_BYTES_PER_PARAM = 4
"""A frozen fp32 parameter (LoRA's base model)."""
SYNC_BUCKET_BYTES = 128 << 20
"""One bucket of a full-weight sync to the engines: the publisher's default bucket size
(``agentrl.weight_sync.full.DEFAULT_BUCKET_BYTES``); a tensor larger than that is gathered whole."""
GIB = 1 << 30


def trainer_bytes_per_rank(shape: DecoderShape, trainer: TrainerSettings, ranks: int) -> int:
    """Estimated memory of one trainer rank (see the module docstring) for ``trainer``, sharded over ``ranks``."""
    params = shape.params()
    if not trainer.lora:
        return params * FULL_BYTES_PER_PARAM // ranks + sync_bucket_bytes(shape)
    adapter = shape.lora_params(trainer.lora_rank, trainer.lora_modules)
    return (params * FROZEN_BYTES_PER_PARAM + adapter * FULL_BYTES_PER_PARAM) // ranks


def sync_bucket_bytes(shape: DecoderShape) -> int:
    """The largest bucket a full-weight sync gathers (in fp32, conservatively): the publisher's bucket size, or
    the largest tensor when that is bigger, and never more than the whole model."""
    return min(shape.params() * 4, max(SYNC_BUCKET_BYTES, shape.largest_tensor() * 4))


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def _gib(n: int) -> str:
    return f"{n / GIB:.1f}" if n >= GIB // 10 else f"{n / GIB:.3f}"


def trainer_memory_note(shape: DecoderShape, trainer: TrainerSettings, ranks: int) -> str:
    """One line for the placement plan: the per-rank estimate and what it is made of."""
    size = _gib(trainer_bytes_per_rank(shape, trainer, ranks))
    over = f"sharded over {ranks} rank{'s' if ranks != 1 else ''}"
    if not trainer.lora:
        what = (f"full weights: fp32 params + grads + AdamW states of {_count(shape.params())} parameters, "
                f"{over}, plus one weight-sync bucket on rank 0")
    else:
        adapter = shape.lora_params(trainer.lora_rank, trainer.lora_modules)
        what = (f"LoRA: frozen fp32 base of {_count(shape.params())} parameters plus the adapter's "
                f"{_count(adapter)} parameters with grads and AdamW states, {over}")
    return f"trainer memory: ~{size} GiB per rank ({what}; activations not counted)"
