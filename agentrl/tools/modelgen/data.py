"""Synthetic data for the tiny model: calc transcripts (train split only) and a little generic text."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

from agentrl.core.errors import ConfigError
from agentrl.tools.modelgen.tokenizer import EOS_TOKEN, render_chat

GENERIC_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "A small model can learn a narrow task when the data is clean and the steps are clear.",
    "Numbers are written with digits, and each digit is its own token.",
    "Use the tool to compute the result, then read the result and answer with the number.",
    "She walked to the market in the morning and bought bread, milk and fresh fruit.",
    "The weather was cold, so they stayed inside and played cards by the window.",
    "He counted the coins twice before putting them back in the jar.",
    "Every answer should be short, correct and easy to check.",
    "If the calculation fails, read the error message and try a simpler expression.",
    "The train left the station at noon and arrived two hours later.",
    "They planted trees along the river, and in spring the leaves turned green.",
    "Questions about totals, differences, products and shares are common in school.",
    "Write the expression with plus, minus, times and divided by, using parentheses when needed.",
    "The library opens at nine and closes at five on most days of the week.",
    "Reading the question carefully is the first step to solving it.",
]


def calc_messages(task: dict[str, Any], system_prompt: str | None) -> list[dict[str, Any]]:
    """The ideal episode for ``task``: one ``calculate`` call, its result, and the final answer."""
    from agentrl.envs.calc.env import ideal_messages

    return ideal_messages(task, system_prompt)


def calc_env_info() -> tuple[str | None, list[dict[str, Any]]]:
    """The calc environment's system prompt and tool schemas."""
    from agentrl.envs.calc import CalcEnv

    return CalcEnv.system_prompt, CalcEnv.tool_schemas()


def train_tasks(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` calc tasks from the TRAIN split only (the test split is never used for warm-up)."""
    from agentrl.envs.calc import make_tasks

    return make_tasks("train", n, seed=seed)


def probe_tasks(n: int, seed: int, exclude: int) -> list[dict[str, Any]]:
    """``n`` train-split calc tasks that are not among the first ``exclude`` warm-up tasks of ``seed``
    (so a probe measures generalisation without touching the test split)."""
    from agentrl.envs.calc import make_tasks

    seen = {t["question"] for t in train_tasks(exclude, seed)}
    fresh = [t for t in make_tasks("train", n + exclude, seed=seed + 1_000_003) if t["question"] not in seen]
    if len(fresh) < n:
        raise ProbeTasksUnavailable(f"could not draw {n} unseen probe tasks")
    return fresh[:n]


def tokenizer_corpus(n_transcripts: int, seed: int) -> Iterator[str]:
    """Rendered calc transcripts plus generic sentences, for training the BPE."""
    system_prompt, tools = calc_env_info()
    for task in train_tasks(n_transcripts, seed):
        yield render_chat(calc_messages(task, system_prompt), tools)
    rng = random.Random(seed)
    for _ in range(4):
        lines = list(GENERIC_TEXT)
        rng.shuffle(lines)
        yield " ".join(lines)


Render = Callable[[list[dict[str, Any]], "list[dict[str, Any]] | None", bool], str]
"""``render(messages, tools, add_generation_prompt)``: a chat template's text."""


class NotAppendOnly(ConfigError, ValueError):
    """A chat template rewrote earlier text when a message was added, so turns cannot be cut from it."""

    code = "config.chat_template.not_append_only"


class ProbeTasksUnavailable(ConfigError, RuntimeError):
    """Fewer unseen train tasks can be drawn than the probe asks for."""

    code = "config.probe_tasks"


def segments(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, render: Render | None = None,
             eos: str = EOS_TOKEN) -> list[tuple[str, bool]]:
    """Split a rendered conversation into (text, trainable) pieces.

    Trainable pieces are each assistant message's body through its end-of-turn token ``eos``: exactly what
    the model generates after the generation prompt. ``render`` is the chat template (default: the embedded
    model's); it must only ever append (:class:`NotAppendOnly` otherwise).
    """
    render = render or (lambda m, t, g: render_chat(m, t, add_generation_prompt=g))
    out: list[tuple[str, bool]] = []
    done = ""
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = render(messages[:k], tools, True)
        full = render(messages[: k + 1], tools, False)
        if not (prompt.startswith(done) and full.startswith(prompt)):
            raise NotAppendOnly("chat template lost the prefix property")
        body_end = full.rindex(eos) + len(eos)
        out += [(prompt[len(done) :], False), (full[len(prompt) : body_end], True)]
        done = full[:body_end]
    full = render(messages, tools, False)
    if not full.startswith(done):
        raise NotAppendOnly("chat template lost the prefix property")
    out.append((full[len(done) :], False))
    return [(text, trainable) for text, trainable in out if text]


def encode_example(tokenizer: Any, pieces: list[tuple[str, bool]]) -> tuple[list[int], list[int]]:
    """Token ids and loss mask (1 on trainable pieces) of a segmented conversation."""
    ids: list[int] = []
    mask: list[int] = []
    for text, trainable in pieces:
        piece = tokenizer.encode(text, add_special_tokens=False)
        ids += piece
        mask += [int(trainable)] * len(piece)
    return ids, mask
