"""Trainer-format MoE weights back to checkpoint format, for engines that load checkpoint names.

transformers 5 holds the experts of a MoE layer fused (``mlp.experts.gate_up_proj`` ``[E, 2I, H]`` and
``mlp.experts.down_proj`` ``[E, H, I]``, converted at load from the per-expert tensors of the checkpoint).
vLLM's ``load_weights`` takes the checkpoint's per-expert names, so a full-weight sync splits the fused
tensors again (views, no copies): ``experts.<e>.{gate,up,down}_proj.weight`` for the Qwen2-MoE, Qwen3-MoE and
OLMoE layouts, ``block_sparse_moe.experts.<e>.{w1,w3,w2}.weight`` for Mixtral (whose other ``mlp.`` names are
``block_sparse_moe.`` in its checkpoints). Every other tensor passes through unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

_EXPERT_NAMES = {
    "qwen2_moe": ("gate_proj", "up_proj", "down_proj"),
    "qwen3_moe": ("gate_proj", "up_proj", "down_proj"),
    "olmoe": ("gate_proj", "up_proj", "down_proj"),
    "mixtral": ("w1", "w3", "w2"),
}
"""Checkpoint names of an expert's gate, up and down projections, per model type."""


def to_checkpoint(weights: Iterable[tuple[str, Any]], model_type: str) -> Iterator[tuple[str, Any]]:
    """``weights`` (trainer names and tensors) with fused expert tensors split per expert under checkpoint
    names; unchanged for a model type without fused experts."""
    names = _EXPERT_NAMES.get(model_type)
    for name, t in weights:
        if names is None:
            yield name, t
            continue
        if model_type == "mixtral":
            name = name.replace(".mlp.", ".block_sparse_moe.")
        gate, up, down = names
        if name.endswith(".experts.gate_up_proj") and t.dim() == 3:
            base, half = name[: -len("gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):
                yield f"{base}{e}.{gate}.weight", t[e, :half]
                yield f"{base}{e}.{up}.weight", t[e, half:]
        elif name.endswith(".experts.down_proj") and t.dim() == 3:
            base = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                yield f"{base}{e}.{down}.weight", t[e]
        else:
            yield name, t
