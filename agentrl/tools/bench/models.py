"""Random Qwen2 models and LoRA adapters for benchmarks (no model hub needed).

``build_random_qwen2`` writes a deterministic random model directory (weights + a small byte-level BPE
tokenizer) in one of the named shapes; ``lora_shapes`` / ``random_lora`` / ``save_lora`` give a peft-format
q/k/v/o adapter for it without loading the model.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
             "head_dim": 64, "intermediate_size": 256},
    "small": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 64, "intermediate_size": 768},
    "0.5b": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "head_dim": 64, "intermediate_size": 4864},
}
"""Shapes: ``tiny`` is the test model; ``small`` a CPU benchmark trunk; ``0.5b`` is Qwen2-0.5B's trunk with a
small vocabulary."""

_CORPUS = ["The quick brown fox jumps over the lazy dog.", "What is 12 plus 30? The answer is 42.",
           "Agents call tools, read observations, and answer questions.", "def add(a, b):\n    return a + b\n",
           "0 1 2 3 4 5 6 7 8 9 + - * / = ( ) [ ] { } , . ; : ! ?"]
_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def _tokenizer(out_dir: Path) -> tuple[int, int, int]:
    """Train and save a ~400-token byte-level BPE tokenizer; returns (vocab size, eos id, pad id)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=_SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", unk_token=None)
    fast.save_pretrained(out_dir)
    return len(fast), fast.convert_tokens_to_ids("<|im_end|>"), fast.convert_tokens_to_ids("<|endoftext|>")


def build_random_qwen2(out_dir: Path, size: str = "tiny", seed: int = 0, context: int = 2048) -> Path:
    """Write a random Qwen2 causal LM of shape ``SIZES[size]`` with a ``context``-token window (fp32 safetensors +
    tokenizer) into ``out_dir``.

    Deterministic for ``(size, seed, context)``; an existing complete build is reused. Weights are N(0, s) with
    s = 0.1 for ``tiny`` (a peaked next-token distribution) and 0.03 otherwise.
    """
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out_dir = Path(out_dir)
    stamp = out_dir / ".agentrl-bench-model.json"
    want = {"size": size, "seed": seed, **SIZES[size], **({"context": context} if context != 2048 else {})}
    if stamp.is_file() and json.loads(stamp.read_text()) == want:
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab, eos_id, pad_id = _tokenizer(out_dir)
    cfg = Qwen2Config(**SIZES[size], vocab_size=vocab, max_position_embeddings=context, tie_word_embeddings=True,
                      eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None, torch_dtype="float32")
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    std = 0.1 if size == "tiny" else 0.03
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    model.save_pretrained(out_dir, safe_serialization=True)
    GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id).save_pretrained(out_dir)
    del model
    stamp.write_text(json.dumps(want))
    return out_dir


ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def lora_shapes(size: str | dict, rank: int = 16, targets: tuple[str, ...] = TARGETS,
                output_layer: bool = False) -> dict[str, tuple[int, int]]:
    """peft tensor name -> shape of a rank-``rank`` adapter on the ``targets`` linear modules of every layer, for
    ``SIZES[size]`` or a model's ``config.json`` (a dict); with ``output_layer``, on ``lm_head`` too."""
    from agentrl.launch.memory import DecoderShape

    config = {**SIZES[size], "vocab_size": 400} if isinstance(size, str) else size
    shape = DecoderShape.from_config(config)
    dims = shape.linear_dims()
    shapes: dict[str, tuple[int, int]] = {}
    for layer in range(shape.layers):
        for m in targets:
            base = f"base_model.model.model.layers.{layer}.{'self_attn' if m in ATTENTION else 'mlp'}.{m}"
            shapes[f"{base}.lora_A.weight"] = (rank, dims[m][0])
            shapes[f"{base}.lora_B.weight"] = (dims[m][1], rank)
    if output_layer:
        shapes["base_model.model.lm_head.lora_A.weight"] = (rank, int(config["hidden_size"]))
        shapes["base_model.model.lm_head.lora_B.weight"] = (int(config["vocab_size"]), rank)
    return shapes


def random_lora(shapes: dict[str, tuple[int, int]], seed: int, std: float = 0.1) -> dict[str, torch.Tensor]:
    """Random adapter tensors (B non-zero, unlike peft's init, so every update changes the outputs)."""
    gen = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=gen) * std for n, s in shapes.items()}


def save_lora(path: Path, tensors: dict[str, torch.Tensor], rank: int = 16, alpha: int = 32,
              alpha_pattern: dict[str, float] | None = None) -> Path:
    """Write a peft adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``) at ``path``; its
    target modules are those the tensors' names hold. ``alpha_pattern``: peft's per-module alphas (module name
    pattern -> alpha), so that modules are scaled differently."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    targets = sorted({name.split(".lora_")[0].rsplit(".", 1)[-1] for name in tensors})
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha, "lora_dropout": 0.0,
           "target_modules": targets, "bias": "none", "use_rslora": False, "base_model_name_or_path": None,
           "fan_in_fan_out": False, "inference_mode": True, "alpha_pattern": dict(alpha_pattern or {})}
    (path / "adapter_config.json").write_text(json.dumps(cfg, indent=1))
    save_file(tensors, str(path / "adapter_model.safetensors"), metadata={"format": "pt"})
    return path


class FixedAdapter:
    """Stands in for a trainer (``TrainerProcess``) with fixed adapter tensors: a publisher asks for them
    (``get_adapter_tensors``, no gather cost) or for their files (``save_adapter``: a peft directory of rank
    ``rank`` and ``lora_alpha`` ``alpha``)."""

    def __init__(self, tensors: dict[str, torch.Tensor], rank: int = 16, alpha: int = 32) -> None:
        self.tensors, self.rank, self.alpha = tensors, rank, alpha

    async def get_adapter_tensors(self) -> dict[str, torch.Tensor]:
        return self.tensors

    async def save_adapter(self, path: str | Path) -> dict[str, str]:
        save_lora(Path(path), self.tensors, rank=self.rank, alpha=self.alpha)
        return {"path": str(path)}
