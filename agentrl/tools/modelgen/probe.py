"""Measure the tiny model's calc success rate without vLLM: full episodes with HF ``generate``.

Each episode follows the real loop: render the chat, sample one turn (up to ``max_tokens_per_turn``),
run Hermes-style ``<tool_call>`` blocks through the real `CalcEnv` tool, feed the results back, and stop
at an answer without a tool call, a malformed call, a cut generation or ``max_turns``; then score with
`CalcEnv.reward`.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import torch

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]] | None]:
    """Split a model turn into (content, tool calls); tool calls is None if a block is malformed."""
    calls = []
    for i, raw in enumerate(_TOOL_CALL.findall(text)):
        try:
            obj = json.loads(raw)
            name, args = obj["name"], obj.get("arguments", {})
        except (ValueError, KeyError, TypeError):
            return text, None
        calls.append({"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}})
    if "<tool_call>" in text and not calls:
        return text, None
    return _TOOL_CALL.sub("", text).strip(), calls


async def _run_tool(env: Any, call: dict[str, Any]) -> str:
    from agentrl.environment.base import ToolError

    try:
        return await env.call_tool(call["function"]["name"], call["function"]["arguments"])
    except ToolError as e:
        return f"Error: {e}"


def run_episodes(
    model: Any, tokenizer: Any, tasks: list[dict[str, Any]], temperature: float = 1.0, seed: int = 0
) -> list[dict[str, Any]]:
    """Play one episode per task (batched across tasks); return messages and reward of each."""
    from agentrl.envs.calc import CalcEnv

    torch.manual_seed(seed)
    tools = CalcEnv.tool_schemas()
    envs = [CalcEnv() for _ in tasks]
    chats: list[list[dict[str, Any]]] = []
    for env, task in zip(envs, tasks, strict=True):
        prompt = asyncio.run(env.reset(task))
        chats.append(
            [{"role": "system", "content": CalcEnv.system_prompt}, {"role": "user", "content": prompt}]
        )
    active = list(range(len(tasks)))
    eos_id = tokenizer.eos_token_id
    side, tokenizer.padding_side = tokenizer.padding_side, "left"  # restored below
    for _ in range(CalcEnv.max_turns):
        if not active:
            break
        texts = [
            tokenizer.apply_chat_template(chats[i], tools=tools, tokenize=False, add_generation_prompt=True)
            for i in active
        ]
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        sample = temperature > 0
        with torch.no_grad():
            out = model.generate(
                **batch,
                max_new_tokens=CalcEnv.max_tokens_per_turn,
                do_sample=sample,
                temperature=temperature if sample else None,
                top_k=0 if sample else None,
                top_p=1.0 if sample else None,
                eos_token_id=eos_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        still = []
        for row, i in enumerate(active):
            new = out[row, batch["input_ids"].shape[1] :].tolist()
            finished = eos_id in new
            new = new[: new.index(eos_id)] if finished else new
            content, calls = parse_tool_calls(tokenizer.decode(new, skip_special_tokens=False))
            if not finished or calls is None or not calls:
                chats[i].append({"role": "assistant", "content": content})
                continue
            chats[i].append({"role": "assistant", "content": content, "tool_calls": calls})
            for call in calls:
                chats[i].append({"role": "tool", "content": asyncio.run(_run_tool(envs[i], call))})
            still.append(i)
        active = still
    tokenizer.padding_side = side
    results = []
    for env, chat in zip(envs, chats, strict=True):
        scored = asyncio.run(env.reward(chat))
        results.append({"messages": chat, "reward": scored["reward"], "used_tool": scored["used_tool"]})
    return results


def probe_success(
    model_dir: str | Path, n: int = 100, temperature: float = 1.0, seed: int = 0, split: str = "test"
) -> float:
    """Mean calc reward of the model in ``model_dir`` over the first ``n`` tasks of ``split``.

    ``temperature=0`` decodes greedily; otherwise tokens are sampled from the full distribution.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.envs.calc import CalcEnv

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return success_rate(model, tokenizer, list(CalcEnv.tasks(split))[:n], temperature=temperature, seed=seed)


def success_rate(
    model: Any, tokenizer: Any, tasks: list[dict[str, Any]], temperature: float = 1.0, seed: int = 0
) -> float:
    """Mean calc reward of ``model`` (in memory) over one episode per task."""
    results = run_episodes(model, tokenizer, tasks, temperature=temperature, seed=seed)
    return sum(r["reward"] for r in results) / max(1, len(results))


def main() -> None:
    """``python -m agentrl.tools.modelgen.probe MODEL_DIR [N]``: print success at temperature 1.0 and greedy."""
    import sys

    torch.set_num_threads(2)
    model_dir = sys.argv[1] if len(sys.argv) > 1 else "models/tiny"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    for temperature in (1.0, 0.0):
        print(
            f"temperature={temperature}: success={probe_success(model_dir, n=n, temperature=temperature):.3f}"
        )


if __name__ == "__main__":
    main()
