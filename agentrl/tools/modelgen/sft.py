"""Supervised warm-up of the tiny model on ideal calc episodes (TRAIN split only).

Plain single-process torch with AdamW; the loss covers assistant tokens only (tool call, final answer,
and their ``<|im_end|>``). Deterministic for a given seed and thread count.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from agentrl.tools.modelgen.data import (
    Render,
    calc_env_info,
    calc_messages,
    encode_example,
    segments,
    train_tasks,
)


@dataclass(frozen=True)
class WarmupConfig:
    """Hyper-parameters of the warm-up (all part of the build config)."""

    steps: int = 1400
    """Maximum optimizer steps. The warm-up stops earlier at the first probe that reaches
    ``target_success`` (see below); without probes (``probe_every`` 0) it runs exactly this many."""
    batch_size: int = 32
    lr: float = 3e-3
    weight_decay: float = 0.01
    lr_warmup: int = 50
    """Linear learning-rate warm-up steps."""
    lr_final: float = 0.0
    """Learning-rate multiplier reached linearly at ``steps`` after the ramp (1.0: constant). The
    decay matters: at a constant 3e-3 the copy skill plateaued at 0.1-0.2 success for 2000 steps on
    one CPU, while decaying to 0 over 1400 steps crossed 0.3 by step 600 for seeds 0 and 1."""
    num_examples: int = 4000
    """Distinct train-split tasks rendered as transcripts (cycled through in shuffled epochs)."""
    probe_from: int = 300
    """First step at which the model is probed (full calc episodes, see `agentrl.tools.modelgen.probe`)."""
    probe_every: int = 25
    """Probe every this many steps from ``probe_from`` on (0: never probe)."""
    probe_tasks: int = 100
    """Probe episodes: unseen train-split tasks (never test tasks), sampled at temperature 1.0."""
    target_success: float = 0.3
    """Stop at the first probe whose success rate reaches this. The skill appears in a sharp
    transition whose step moves with tiny numerical differences between CPUs, so a fixed step count
    gave baselines from 0.1 to 0.5 on different machines; stopping on a measured success rate gives
    a policy that solves some tasks but clearly not all, everywhere."""


Conversation = tuple[list[dict[str, Any]], list[dict[str, Any]] | None]
"""One training conversation: its messages and the tools it was given."""


class ExamplePool:
    """Conversations rendered and tokenized on first use: (token ids, loss mask on assistant turns).

    ``render`` and ``eos`` are the chat template and its end-of-turn text (default: the embedded model's).
    """

    def __init__(self, tokenizer: Any, conversations: list[Conversation], render: Render | None = None,
                 eos: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.conversations = conversations
        self.render = render
        self.eos = eos
        self._cache: dict[int, tuple[list[int], list[int]]] = {}

    @classmethod
    def calc(cls, tokenizer: Any, num_examples: int, seed: int, render: Render | None = None,
             eos: str | None = None) -> ExamplePool:
        """Ideal episodes of ``num_examples`` calc train-split tasks."""
        system_prompt, tools = calc_env_info()
        return cls(tokenizer, [(calc_messages(t, system_prompt), tools) for t in train_tasks(num_examples, seed)],
                   render, eos)

    def __len__(self) -> int:
        return len(self.conversations)

    def __getitem__(self, i: int) -> tuple[list[int], list[int]]:
        if i not in self._cache:
            messages, tools = self.conversations[i]
            kw = {"eos": self.eos} if self.eos else {}
            self._cache[i] = encode_example(self.tokenizer, segments(messages, tools, self.render, **kw))
        return self._cache[i]


def common_prefix_len(examples: list[tuple[list[int], list[int]]]) -> int:
    """Length of the token prefix shared by all examples (system prompt, tools, ``<|im_start|>user``)."""
    first = examples[0][0]
    n = min(len(ids) for ids, _ in examples) - 1
    for ids, mask in examples:
        k = 0
        while k < n and ids[k] == first[k] and not mask[k]:
            k += 1
        n = k
    return n


def _batch(examples: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, ...]:
    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    attn = torch.zeros((len(examples), width), dtype=torch.long)
    for row, (toks, mask) in enumerate(examples):
        n = len(toks)
        ids[row, :n] = torch.tensor(toks)
        attn[row, :n] = 1
        labels[row, :n] = torch.tensor([t if m else -100 for t, m in zip(toks, mask, strict=True)])
    return ids, attn, labels


def batch_loss(
    model: Any, ids: torch.Tensor, attn: torch.Tensor, labels: torch.Tensor, prefix: int
) -> torch.Tensor:
    """Mean loss over labelled tokens; the shared ``prefix`` is run once and its KV cache broadcast.

    Gives the same loss and gradients as a plain forward over the full batch, at a fraction of the cost.
    """
    if prefix <= 0:
        return model(input_ids=ids, attention_mask=attn, labels=labels).loss
    from transformers import DynamicCache

    shared = model.model(input_ids=ids[:1, :prefix], use_cache=True).past_key_values
    cache = DynamicCache()
    for i, layer in enumerate(shared.layers):
        cache.update(layer.keys.expand(len(ids), -1, -1, -1), layer.values.expand(len(ids), -1, -1, -1), i)
    return model(
        input_ids=ids[:, prefix:], attention_mask=attn, past_key_values=cache, labels=labels[:, prefix:]
    ).loss


def _lr_factor(step: int, warmup: int, total: int = 0, final: float = 1.0) -> float:
    """Linear ramp over ``warmup`` steps, then linear decay to ``final`` at step ``total``."""
    ramp = min(1.0, (step + 1) / max(1, warmup))
    if final >= 1.0 or total <= warmup:
        return ramp
    done = min(1.0, max(0, step - warmup) / max(1, total - warmup))
    return ramp * (1.0 - (1.0 - final) * done)


def warmup(
    model: torch.nn.Module,
    tokenizer: Any,
    config: WarmupConfig,
    seed: int = 0,
    progress: bool = True,
    on_step: Callable[[int, float], bool | None] | None = None,
    pool: ExamplePool | None = None,
) -> list[float]:
    """Train ``model`` in place for at most ``config.steps`` AdamW steps; return the per-step losses.

    ``pool`` holds the training conversations (default: ``config.num_examples`` ideal calc episodes in the
    embedded model's template). ``on_step(step, loss)`` is called after every step (e.g. to probe the
    model); the warm-up stops when it returns True.
    """
    if config.steps <= 0:
        return []
    torch.manual_seed(seed)
    pool = pool if pool is not None else ExamplePool.calc(tokenizer, config.num_examples, seed)
    rng = random.Random(seed)
    order: list[int] = []
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=config.lr, weight_decay=config.weight_decay,
        betas=(0.9, 0.98)
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: _lr_factor(s, config.lr_warmup, config.steps, config.lr_final)
    )
    model.train()
    losses: list[float] = []
    bar = tqdm(range(config.steps), desc="warm-up", disable=not progress, leave=False)
    for _ in bar:
        if len(order) < config.batch_size:
            fresh = list(range(len(pool)))
            rng.shuffle(fresh)
            order += fresh
        picked, order = order[: config.batch_size], order[config.batch_size :]
        examples = [pool[i] for i in picked]
        ids, attn, labels = _batch(examples, tokenizer.pad_token_id)
        loss = batch_loss(model, ids, attn, labels, common_prefix_len(examples))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        if on_step is not None and on_step(len(losses), losses[-1]):
            break
    model.eval()
    return losses
