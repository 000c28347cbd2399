"""``agentrl sft``: a short supervised warm-up on tool-call transcripts, before RL.

A chat model that has never seen an environment's tool format rarely calls its tools (SmolLM2-135M-Instruct
made 0 calls in 100 calc tasks with the tools listed in its system prompt), and RL cannot start from a policy
that never succeeds: every group's rewards are equal, so no gradient. Practitioners first fine-tune on a few
hundred ideal transcripts. This does that with the embedded model's warm-up trainer
(:func:`agentrl.tools.modelgen.sft.warmup`: AdamW, a linear ramp and decay, loss on the assistant turns only, the
shared system prompt run once per batch), on a LoRA adapter over every linear layer (merged into the weights
at the end) or on every weight.

The transcripts are an environment's demonstrations (``Environment.demonstration``; ``calc`` has one per
task: the call, its result and the answer), or a JSONL file of ``{"messages": [...], "tools": [...]}`` rows,
the OpenAI chat format. They are rendered with the chat template the RL run will use (``--chat-template``),
so the warm-up teaches exactly the tokens the agent loop will see. The output is a plain model directory
(weights, tokenizer with that template, generation config) with ``agentrl_sft.json``: the base model, the
data, the settings and the loss curve.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentrl.core.errors import ConfigError

MARKER = "agentrl_sft.json"


class SftDataError(ConfigError, ValueError):
    """The warm-up's transcripts cannot be used (none, malformed, or a template that rewrites history)."""

    code = "config.sft_data"


class SftLossNotFinite(ConfigError, RuntimeError):
    """The warm-up's loss diverged (not finite): the learning rate is too high."""

    code = "config.sft_loss_not_finite"


@dataclass(frozen=True)
class SftConfig:
    """Settings of one warm-up (recorded in the output's marker)."""

    steps: int = 100
    """AdamW steps."""
    batch_size: int = 16
    """Transcripts per step."""
    lr: float = 2e-4
    """Peak learning rate (after ``lr_warmup`` steps, then a linear decay to 0 at ``steps``)."""
    lr_warmup: int = 10
    weight_decay: float = 0.0
    lora: bool = True
    """Train a LoRA adapter on every linear layer and merge it into the weights; False trains every weight."""
    lora_rank: int = 16
    lora_alpha: float = 32.0
    examples: int = 1000
    """Distinct transcripts (from the environment's train split, or the first of ``--data``)."""
    seed: int = 0
    threads: int = field(default_factory=lambda: max(1, min(os.cpu_count() or 1, 8)))
    """Torch intra-op threads."""


def conversations_from_jsonl(path: Path, limit: int) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]:
    """The first ``limit`` conversations of a JSONL file of ``{"messages": [...], "tools": [...]}`` rows."""
    out = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise SftDataError(f"cannot read {path}: {e}") from e
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            messages, tools = row["messages"], row.get("tools")
            if not isinstance(messages, list) or not any(m.get("role") == "assistant" for m in messages):
                raise SftDataError("no assistant message")
        except (SftDataError, ValueError, KeyError, TypeError, AttributeError) as e:  # builtins: not such a row
            raise SftDataError(f"{path}, line {n}: not a {{\"messages\": [...], \"tools\": [...]}} row with an "
                               f"assistant message ({e})") from e
        out.append((messages, tools))
        if len(out) >= limit:
            break
    if not out:
        raise SftDataError(f"{path} holds no conversations")
    return out


def conversations_from_env(env: str, limit: int, seed: int) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]:
    """Demonstrations of the first ``limit`` train-split tasks of an environment (shuffled with ``seed``)."""
    from agentrl.environment.registry import load_env

    env_cls = load_env(env)
    tasks = list(env_cls.tasks("train"))
    random.Random(seed).shuffle(tasks)
    tools = env_cls.tool_schemas()
    out = []
    for task in tasks[:limit]:
        messages = env_cls.demonstration(task)
        if messages is None:
            raise SftDataError(f"environment {env!r} has no demonstrations (Environment.demonstration); pass "
                               "transcripts with --data FILE.jsonl")
        out.append((messages, tools))
    return out


def finetune(model_dir: str | Path, out_dir: str | Path, conversations: list[Any], *, chat_template: str | None,
             config: SftConfig, source: dict[str, Any], progress: bool = True) -> dict[str, Any]:
    """Warm ``model_dir`` up on ``conversations`` and save the result in ``out_dir`` (see the module docstring);
    returns the marker's record. ``out_dir`` must not hold anything yet."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.config.trainer import ALL_LINEAR
    from agentrl.rollout.chat import ChatFormat
    from agentrl.tools.modelgen.data import NotAppendOnly
    from agentrl.tools.modelgen.sft import ExamplePool, WarmupConfig, warmup

    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise SftDataError(f"{out_dir} is not empty: choose another --out")
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    chat = ChatFormat(tokenizer, model_dir=model_dir, chat_template=chat_template)
    eos = tokenizer.convert_ids_to_tokens(chat.eos_token_id)

    def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, gen: bool) -> str:
        return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False, add_generation_prompt=gen)

    pool = ExamplePool(tokenizer, conversations, render, eos)
    try:
        pool[0]
    except NotAppendOnly as e:
        raise SftDataError(f"the chat template ({chat.chat_template}) rewrites earlier turns, so assistant turns "
                           "cannot be cut from its render; use an appends-only template") from e
    before = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    start = time.monotonic()
    try:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        model.config.use_cache = False
        trained: Any = model
        if config.lora:
            from peft import LoraConfig, get_peft_model

            torch.manual_seed(config.seed)
            trained = get_peft_model(model, LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha,
                                                       target_modules=list(ALL_LINEAR), task_type="CAUSAL_LM"))
        wcfg = WarmupConfig(steps=config.steps, batch_size=config.batch_size, lr=config.lr,
                            weight_decay=config.weight_decay, lr_warmup=config.lr_warmup, lr_final=0.0,
                            num_examples=len(conversations), probe_every=0)
        hf = trained.get_base_model() if config.lora else trained  # LoRA layers sit inside the HF modules
        losses = warmup(hf, tokenizer, wcfg, seed=config.seed, progress=progress, pool=pool)
        final = trained.merge_and_unload() if config.lora else trained
    finally:
        torch.set_num_threads(before)
    if not losses or not all(math.isfinite(x) for x in losses):
        raise SftLossNotFinite(f"the warm-up's loss is not finite ({losses[-3:]}): lower --lr")
    record = {"base_model": str(model_dir), "chat_template": chat.chat_template, "data": source,
              "config": asdict(config), "examples": len(conversations), "train_seconds": round(time.monotonic() - start, 1),
              "loss_first": losses[0], "loss_last": losses[-1],
              "loss_every_10": [round(x, 4) for x in losses[::10]]}
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=f".{out_dir.name}.") as tmp_name:
        tmp = Path(tmp_name) / "model"
        final.config.use_cache = True
        final.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)  # with the template the warm-up rendered
        if (Path(model_dir) / "generation_config.json").is_file():
            shutil.copy2(Path(model_dir) / "generation_config.json", tmp / "generation_config.json")
        (tmp / MARKER).write_text(json.dumps(record, indent=2) + "\n")
        if out_dir.exists():
            out_dir.rmdir()
        os.replace(tmp, out_dir)
    return record
