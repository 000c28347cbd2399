"""Small test tokenizers (and tiny random models) for real model families.

Each family is a byte-level BPE trained on a small corpus that carries the family's published chat
template (``tests/data/chat_templates``) and its special tokens, with the eos list of the family's
``generation_config.json``. The models are random (their output is noise) and built so that vLLM's CPU
backend serves them (head_dim 64). The template's end-of-turn token gets a bias through the first layer's
value bias, so that the random model ends its turns after a few tokens (exercising stop tokens).

Templates: Qwen2.5-Instruct's and Qwen3's (``tokenizer_config.json`` of the models), Llama 3.1's JSON
tool template (vLLM's ``examples/tool_chat_template_llama3.1_json.jinja``) and Mistral-7B-Instruct-v0.3's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"


@dataclass(frozen=True)
class Family:
    """What a test tokenizer of one family needs."""

    name: str
    template: str
    tool_parser: str
    special: list[str]
    """Special tokens (skipped by skip_special_tokens), first ones first in the vocabulary."""
    bos: str | None
    eos: str
    pad: str | None
    generation_eos: list[str]
    """eos_token_id list of the family's generation_config.json."""
    added: list[str] = field(default_factory=list)
    """Non-special added tokens (Qwen's <tool_call>, <think>, ...)."""
    arch: str = "qwen2"

    @property
    def chat_template(self) -> str:
        return (TEMPLATES / self.template).read_text()


_QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_QWEN_ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
FAMILIES: dict[str, Family] = {
    "qwen2.5": Family("qwen2.5", "qwen2_5.jinja", "hermes", _QWEN_SPECIAL, None, "<|im_end|>", "<|endoftext|>",
                      ["<|im_end|>", "<|endoftext|>"], _QWEN_ADDED),
    "llama3.1": Family("llama3.1", "llama3_1_json.jinja", "llama3_json",
                       ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                        "<|eot_id|>", "<|eom_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>"],
                       "<|begin_of_text|>", "<|eot_id|>", "<|finetune_right_pad_id|>",
                       ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"], arch="llama"),
    "mistral": Family("mistral", "mistral_v3.jinja", "mistral",
                      ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                       "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"],
                      "<s>", "</s>", None, ["</s>"], arch="mistral"),
    "qwen3": Family("qwen3", "qwen3.jinja", "hermes", _QWEN_SPECIAL, None, "<|im_end|>", "<|endoftext|>",
                    ["<|im_end|>", "<|endoftext|>"], [*_QWEN_ADDED, "<think>", "</think>"]),
}

_CORPUS = [
    "What is 12 plus 30? The answer is 42.", "Look a word up in the dictionary.", "An apple is a round fruit.",
    '{"name": "calculate", "arguments": {"expression": "2 + 3"}}', '{"output": "5"}', "Answer briefly.",
    "You are a helpful assistant with tool calling capabilities.", "Cutting Knowledge Date: December 2023",
    "0 1 2 3 4 5 6 7 8 9 + - * / = ( ) [ ] { } , . ; : ! ? \" ' # _ < > |",
    "function type object properties parameters description required string integer expression",
]


def build_family_tokenizer(family: Family, out_dir: Path) -> Any:
    """Train the family's test tokenizer and save it (with its chat template) into ``out_dir``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=480, min_frequency=2, special_tokens=family.special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    if family.added:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in family.added])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=family.bos, eos_token=family.eos,
                                   pad_token=family.pad, unk_token="<unk>" if "<unk>" in family.special else None,
                                   clean_up_tokenization_spaces=False, model_max_length=1024)
    fast.chat_template = family.chat_template
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    ids = [fast.convert_tokens_to_ids(t) for t in family.generation_eos]
    (out_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": ids}))
    return fast


def build_family_model(family: Family, out_dir: Path, *, end_bias: float = 1.8, seed: int = 0) -> Path:
    """A tiny random causal LM of the family's architecture on its test tokenizer, in ``out_dir``.

    The model's output is noise: every token is equally likely except the template's end-of-turn token,
    tilted up by ``end_bias`` so that turns end after a few tokens.
    """
    import torch
    import transformers

    out_dir = Path(out_dir)
    tokenizer = build_family_tokenizer(family, out_dir)
    cfg_cls, model_cls = {"qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "llama": ("LlamaConfig", "LlamaForCausalLM"),
                          "mistral": ("MistralConfig", "MistralForCausalLM")}[family.arch]
    eos = [tokenizer.convert_tokens_to_ids(t) for t in family.generation_eos]
    cfg = getattr(transformers, cfg_cls)(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, head_dim=64,
        intermediate_size=256, vocab_size=len(tokenizer), max_position_embeddings=1024, tie_word_embeddings=True,
        eos_token_id=eos, bos_token_id=tokenizer.bos_token_id, pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32")
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(cfg)
    end = tokenizer.convert_tokens_to_ids(family.eos)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
        # a constant component in every input embedding stays in the residual stream; with tied embeddings
        # it shifts every logit alike, and the end-of-turn token's larger component tilts towards it
        for w in {id(w): w for w in (model.model.embed_tokens.weight, model.lm_head.weight)}.values():
            w[:, 1] = 5.0
            w[end, 1] = 5.0 + end_bias
        for layer in model.model.layers:  # no layer writes into that component
            layer.self_attn.o_proj.weight[1, :] = 0.0
            layer.mlp.down_proj.weight[1, :] = 0.0
        # the final norm passes only that component on: the next-token distribution is uniform over the
        # vocabulary except for the end-of-turn token's tilt
        model.model.norm.weight.zero_()
        model.model.norm.weight[1] = 1.0
    model.save_pretrained(out_dir, safe_serialization=True)
    (out_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return out_dir
