"""The tiny model's tokenizer: a byte-level BPE with single-digit tokens and a Hermes/Qwen2.5 chat template.

The chat template renders (``\\n`` is a newline)::

    <|im_start|>system\\n{system}\\n<tools>\\n{tool json, one per line}\\n</tools><|im_end|>\\n
    <|im_start|>user\\n{content}<|im_end|>\\n
    <|im_start|>assistant\\n{content}<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call><|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n{result}\\n</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n                       (the generation prompt)

Consecutive tool messages share one user turn (as in Qwen2.5). To keep the *prefix property* (rendering
``messages[:k]`` is a string prefix of rendering ``messages[:k+1]``) that turn is closed lazily: its
``<|im_end|>\\n`` is written by whatever follows it (the next message or the generation prompt). Several
tool calls in one assistant message, or text before a tool call, are separated by a newline (an
assistant message with empty content starts directly with ``<tool_call>``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN]
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
"""Added as ordinary (non-special) single tokens, so they survive ``skip_special_tokens=True``."""

CHAT_TEMPLATE = (
    "{%- macro text(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- elif content -%}{%- for part in content -%}"
    "{%- if part.text is defined -%}{{- part.text -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- set ns = namespace(prev='') -%}"
    "{%- set has_system = messages | length > 0 and messages[0].role == 'system' -%}"
    "{%- if tools or has_system -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if has_system -%}{{- text(messages[0].content) -}}{%- if tools -%}{{- '\\n' -}}{%- endif -%}{%- endif -%}"
    "{%- if tools -%}{{- '<tools>' -}}"
    "{%- for t in tools -%}{{- '\\n' + (t | tojson(separators=(',', ':'))) -}}{%- endfor -%}"
    "{{- '\\n</tools>' -}}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if loop.first and has_system -%}"
    "{%- elif message.role == 'tool' -%}"
    "{%- if ns.prev != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + text(message.content) + '\\n</tool_response>' -}}"
    "{%- else -%}"
    "{%- if ns.prev == 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + text(message.content) -}}"
    "{%- if message.role == 'assistant' and message.tool_calls -%}"
    "{%- for call in message.tool_calls -%}"
    "{%- if call.function is defined -%}{%- set call = call.function -%}{%- endif -%}"
    "{%- if message.content or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": ' + (call.name | tojson) + ', \"arguments\": ' -}}"
    "{%- if call.arguments is string -%}{{- call.arguments -}}"
    "{%- elif call.arguments -%}{{- call.arguments | tojson -}}"
    "{%- else -%}{{- '{}' -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- set ns.prev = message.role -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{%- if ns.prev == 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)

_RESERVED = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS + TOOL_TOKENS))


def render_chat(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
) -> str:
    """Render ``messages`` with `CHAT_TEMPLATE` (what ``apply_chat_template(tokenize=False)`` returns)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        conversations=[messages],
        tools=tools,
        chat_template=CHAT_TEMPLATE,
        add_generation_prompt=add_generation_prompt,
    )
    return rendered[0]


def train_tokenizer(corpus: Iterable[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE on ``corpus`` and wrap it with special tokens and the chat template.

    ``vocab_size`` counts everything, the added tool tokens included. Deterministic for a given corpus.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TOOL_TOKENS),
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Reserved strings become single tokens below; keep them out of the merges.
    tok.train_from_iterator((_RESERVED.sub("\n", text) for text in corpus), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        bos_token=None,
        unk_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=2048,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped
