"""A tiny, random, deterministic Qwen2 model for tests (no model hub needed).

``build_random_tiny_model`` is the single entry point: the lead can later swap it for
``agentrl.tools.modelgen`` without touching the tests that use it.
"""

from __future__ import annotations

from pathlib import Path

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is 12 plus 30? The answer is 42.",
    "Agents call tools, read observations, and answer questions.",
    "def add(a, b):\n    return a + b\n",
    "Reinforcement learning improves a policy from rewards.",
    "<tool_call>calc(2 * 21)</tool_call> <tool_response>42</tool_response>",
    "0 1 2 3 4 5 6 7 8 9 + - * / = ( ) [ ] { } , . ; : ! ?",
]
_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _build_tokenizer(out_dir: Path):
    """Train a small byte-level BPE tokenizer and save it as a fast HF tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    fast.chat_template = _CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def build_random_tiny_model(out_dir: Path, seed: int = 0, moe: bool = False) -> Path:
    """Write a random tiny Qwen2 causal LM (+ tokenizer) into ``out_dir`` and return it.

    Deterministic for a given ``seed``. Architecture: hidden 128, 2 layers, 2 heads of
    dim 64 (head_dim 16 crashes vLLM's CPU attention backend), fp32 safetensors. ``moe``: a Qwen3-MoE
    model of the same size (every layer 8 experts, top-2, expert width 128).
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config, Qwen3MoeConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _build_tokenizer(out_dir)
    vocab_size = len(tokenizer)
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config_cls, arch = (Qwen3MoeConfig, {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
                                         "norm_topk_prob": True}) if moe else (Qwen2Config, {})
    cfg = config_cls(
        **arch,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=256,
        vocab_size=vocab_size,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=None,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    # A wider init than the default 0.02 makes the random model's next-token
    # distribution peaked enough that small weight changes are visible.
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    model.save_pretrained(out_dir, safe_serialization=True)
    GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id).save_pretrained(out_dir)
    return out_dir
