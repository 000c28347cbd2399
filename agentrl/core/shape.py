"""The shape of a decoder-only transformer, read from its Hugging Face ``config.json``: what sets its parameter
count (the trainer's memory estimate, ``agentrl.launch.memory``) and its KV cache per token (the CPU engine's
cache size, ``agentrl.inference.server.kv_cache_gib``), and the context window it declares (what
``agentrl serve-policy`` serves by default). Pure Python: the standard library only."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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

    def kv_elements_per_token(self) -> int:
        """Elements one token takes in the KV cache: a key and a value per KV head, in every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim

    def largest_tensor(self) -> int:
        """Elements of the largest single weight (the embedding, for most models)."""
        return max(self.vocab * self.hidden, *(i * o for i, o in self.linear_dims().values()))

    def lora_params(self, rank: int, targets: Sequence[str]) -> int:
        """Parameters of a rank-``rank`` LoRA adapter on the ``targets`` linear modules of every layer, and on the
        output layer where ``lm_head`` is one of them (names this shape does not know, and an MoE's expert MLPs,
        are not counted)."""
        dims = self.linear_dims()
        if self.experts > 1:
            dims = {k: v for k, v in dims.items() if k in ("q_proj", "k_proj", "v_proj", "o_proj")}
        head = rank * (self.hidden + self.vocab) if "lm_head" in targets else 0  # the output layer's LoRA
        return self.layers * sum(rank * sum(dims[t]) for t in targets if t in dims) + head


def read_shape(model_path: str) -> DecoderShape | None:
    """The shape of a local model directory's ``config.json``; None when there is none (a hub id, a model not
    built yet) or it does not describe a decoder this module knows."""
    path = Path(model_path) / "config.json"
    try:
        return DecoderShape.from_config(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_window(model_path: str) -> int | None:
    """The context window a local model directory's ``config.json`` declares (``max_position_embeddings``, its
    ``text_config``'s for a multimodal model); None when there is no such file or it names no window."""
    path = Path(model_path) / "config.json"
    try:
        config = json.loads(path.read_text())
        window = (config.get("text_config") or config).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    return window if isinstance(window, int) and not isinstance(window, bool) and window > 0 else None
