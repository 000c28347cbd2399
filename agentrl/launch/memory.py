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

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.config.trainer import TrainerConfig

FULL_BYTES_PER_PARAM = 4 + 4 + 8
"""fp32 parameter + fp32 gradient + AdamW's two fp32 moments."""
FROZEN_BYTES_PER_PARAM = 4
"""A frozen fp32 parameter (LoRA's base model)."""
SYNC_BUCKET_BYTES = 128 << 20
"""One bucket of a full-weight sync to the engines: the publisher's default bucket size
(``agentrl.weight_sync.full.DEFAULT_BUCKET_BYTES``); a tensor larger than that is gathered whole."""
GIB = 1 << 30


@dataclass(frozen=True)
class DecoderShape:
    """The shapes of a dense decoder-only transformer that set its parameter count."""

    vocab: int
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    """The output head shares the input embedding (``tie_word_embeddings``)."""
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool
    """Per-head RMSNorm of queries and keys (Qwen3)."""
    experts: int = 1
    """MLPs per layer (mixture of experts; 1: dense). Shared experts are not counted."""

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> DecoderShape:
        """The shape of a Hugging Face ``config.json`` (its ``text_config`` for a multimodal model); ``KeyError``
        when a required size is missing."""
        c = config.get("text_config") or config
        kind = str(c.get("model_type", ""))
        hidden, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
        experts = int(c.get("num_local_experts") or c.get("num_experts") or 1)
        intermediate = c.get("moe_intermediate_size") if experts > 1 else None
        return cls(
            vocab=int(c["vocab_size"]), hidden=hidden, layers=int(c["num_hidden_layers"]),
            intermediate=int(intermediate or c["intermediate_size"]), heads=heads,
            kv_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or hidden // heads), tied=bool(c.get("tie_word_embeddings", False)),
            qkv_bias=bool(c.get("attention_bias")) or kind.startswith("qwen2"),  # Qwen2: q/k/v biases always
            o_bias=bool(c.get("attention_bias")), qk_norm=kind.startswith("qwen3"), experts=experts,
        )

    def linear_dims(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear module of one layer, by its Hugging Face name."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {"q_proj": (self.hidden, q), "k_proj": (self.hidden, kv), "v_proj": (self.hidden, kv),
                "o_proj": (q, self.hidden), "gate_proj": (self.hidden, self.intermediate),
                "up_proj": (self.hidden, self.intermediate), "down_proj": (self.intermediate, self.hidden)}

    def params(self) -> int:
        """Every parameter of the causal LM (a tied output head counted once)."""
        dims = self.linear_dims()
        attn = sum(dims[name][0] * dims[name][1] for name in ("q_proj", "k_proj", "v_proj", "o_proj"))
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn += (q + 2 * kv) * self.qkv_bias + self.hidden * self.o_bias + 2 * self.head_dim * self.qk_norm
        router = self.hidden * self.experts if self.experts > 1 else 0
        mlp = 3 * self.hidden * self.intermediate * self.experts + router
        layer = attn + mlp + 2 * self.hidden  # two RMSNorms
        head = 0 if self.tied else self.vocab * self.hidden
        return self.vocab * self.hidden + self.layers * layer + self.hidden + head

    def largest_tensor(self) -> int:
        """Elements of the largest single weight (the embedding, for most models)."""
        return max(self.vocab * self.hidden, *(i * o for i, o in self.linear_dims().values()))

    def lora_params(self, rank: int, targets: Sequence[str]) -> int:
        """Parameters of a rank-``rank`` LoRA adapter on the ``targets`` linear modules of every layer (names
        this shape does not know, and an MoE's expert MLPs, are not counted)."""
        dims = self.linear_dims()
        if self.experts > 1:
            dims = {k: v for k, v in dims.items() if k in ("q_proj", "k_proj", "v_proj", "o_proj")}
        return self.layers * sum(rank * sum(dims[t]) for t in targets if t in dims)


def read_shape(model_path: str) -> DecoderShape | None:
    """The shape of a local model directory's ``config.json``; None when there is none (a hub id, a model not
    built yet) or it does not describe a decoder this module knows."""
    path = Path(model_path) / "config.json"
    try:
        return DecoderShape.from_config(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def trainer_bytes_per_rank(shape: DecoderShape, trainer: TrainerConfig, ranks: int) -> int:
    """Estimated memory of one trainer rank (see the module docstring) for ``trainer``, sharded over ``ranks``."""
    params = shape.params()
    if not trainer.lora:
        return params * FULL_BYTES_PER_PARAM // ranks + sync_bucket_bytes(shape)
    adapter = shape.lora_params(trainer.lora_rank, trainer.lora_target_modules)
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


def trainer_memory_note(shape: DecoderShape, trainer: TrainerConfig, ranks: int) -> str:
    """One line for the placement plan: the per-rank estimate and what it is made of."""
    size = _gib(trainer_bytes_per_rank(shape, trainer, ranks))
    over = f"sharded over {ranks} rank{'s' if ranks != 1 else ''}"
    if not trainer.lora:
        what = (f"full weights: fp32 params + grads + AdamW states of {_count(shape.params())} parameters, "
                f"{over}, plus one weight-sync bucket on rank 0")
    else:
        adapter = shape.lora_params(trainer.lora_rank, trainer.lora_target_modules)
        what = (f"LoRA: frozen fp32 base of {_count(shape.params())} parameters plus the adapter's "
                f"{_count(adapter)} parameters with grads and AdamW states, {over}")
    return f"trainer memory: ~{size} GiB per rank ({what}; activations not counted)"
