"""Chat templates agentrl can put in place of a model's own: for models whose template cannot show tools.

Many chat models ship a template that renders no tools and no tool calls (SmolLM2, Gemma, Phi-3, the
DeepSeek-R1 distills): their turns are plain text. agentrl needs a template that lists the tools, renders
an assistant's calls the way the tool parser reads them, and renders tool results, all while only ever
appending. ``chat_template`` (``--chat-template``) names one: a built-in template by name, or a Jinja file.

Built-in templates (``agentrl/rollout/chat_templates/<name>.jinja``):

- ``hermes``: ChatML turns (``<|im_start|>role ... <|im_end|>``), the tools as JSON schemas in the system
  turn, calls as ``<tool_call>`` JSON blocks (vLLM's ``hermes`` parser), each tool result a ``tool`` turn of
  its own. It fits any tokenizer with ChatML's special tokens.

The template a run trained with goes with what it saved (the final adapter or model directory), so vLLM and
``agentrl eval`` render prompts as training did.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.core.errors import ConfigError

BUILTIN_DIR = Path(__file__).parent / "chat_templates"
"""Where the built-in templates live (package data)."""

OWN = "own"
"""The label of a model's own template (no override)."""

SPECIAL_TOKENS = {"hermes": ("<|im_start|>", "<|im_end|>")}
"""The special tokens each built-in template writes: it fits a tokenizer that has them all."""


class UnknownChatTemplate(ConfigError, ValueError):
    """``chat_template`` names neither a built-in template nor a readable file."""

    code = "config.unknown_chat_template"


def builtin_names() -> list[str]:
    """The names of the built-in templates."""
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.jinja"))


@dataclass(frozen=True)
class ChatTemplate:
    """A template to use instead of the model's own: its label (a built-in name, or the file's path) and
    its text."""

    label: str
    text: str


def resolve(spec: str | None) -> ChatTemplate | None:
    """The template ``spec`` names (None: the model's own, so None): a built-in name, else a file path."""
    if spec is None or spec == OWN:
        return None
    if spec in builtin_names():
        return ChatTemplate(label=spec, text=(BUILTIN_DIR / f"{spec}.jinja").read_text())
    path = Path(spec)
    if path.is_file():
        try:
            return ChatTemplate(label=str(path), text=path.read_text())
        except (OSError, UnicodeDecodeError) as e:
            raise UnknownChatTemplate(f"chat_template = {spec!r}: cannot read the file: {e}") from e
    raise UnknownChatTemplate(f"chat_template = {spec!r} is neither a built-in template ({', '.join(builtin_names())}) "
                              "nor a file")


def apply(tokenizer: Any, spec: str | None) -> str:
    """Put the template ``spec`` names on ``tokenizer`` (nothing for None) and return its label: the
    built-in name, the file's path, or :data:`OWN`."""
    template = resolve(spec)
    if template is None:
        return OWN
    tokenizer.chat_template = template.text
    return template.label


def fitting_builtins(tokenizer: Any) -> list[str]:
    """The built-in templates whose special tokens the tokenizer has (each a single token of its vocabulary)."""
    vocab = tokenizer.get_vocab()
    return [name for name in builtin_names() if all(tok in vocab for tok in SPECIAL_TOKENS.get(name, ()))]


TEMPLATE_FILE = "chat_template.jinja"
"""The file a model or adapter directory carries its chat template in (transformers and vLLM read it, and it
wins over a ``chat_template`` entry of ``tokenizer_config.json``)."""


def carry(directory: str | Path, spec: str | None) -> None:
    """Write the template ``spec`` names into a saved model or adapter directory, so that whatever loads it
    renders turns as training did; nothing for None (the model's own, which a saved model already carries)."""
    template = resolve(spec)
    if template is not None:
        (Path(directory) / TEMPLATE_FILE).write_text(template.text)


def carried(adapter_dir: str | Path) -> str | None:
    """The template file an adapter directory carries (its path), or None."""
    path = Path(adapter_dir) / TEMPLATE_FILE
    return str(path) if path.is_file() else None
