"""TRL's side of ``agentrl bench peers``: a GRPO run of TRL's ``GRPOTrainer`` on an agentrl environment.

Run as ``python -m agentrl.tools.bench.peers.trl_side SPEC.json`` in the environment that has TRL (the
benchmark puts TRL on ``PYTHONPATH`` from its own directory; agentrl's dependency set never includes it).
``SPEC.json`` (written by :mod:`agentrl.tools.bench.peers.run`) names the model, the environment, the task
sequence, the ``GRPOConfig`` keyword arguments (:func:`agentrl.tools.bench.peers.settings.trl_config`) and
where to write, and the peft ``LoraConfig`` when the run trains an adapter; the result (per-step times,
generation time and tokens, rewards, the final model's or adapter's directory) is written as JSON beside it.

The adapter is thin:

- every tool of the agentrl environment becomes a method of the TRL environment class, which runs the
  environment's own ``call_tool`` (argument checks, timeouts, tool errors raised as exceptions: TRL returns
  them to the model as ``{"error": ...}``);
- the tools are rendered and parsed with the environment's own JSON schemas (TRL would derive its own from
  the methods' signatures, with other keys), so both frameworks show the model the same prompt;
- the reward is the environment's ``reward`` on the whole conversation, as agentrl scores it;
- the tokenizer's tool-call parser is TRL's ``qwen3_template`` (Hermes ``<tool_call>`` JSON), the format of the
  chat templates agentrl serves here.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _environment_class(env_cls: Any) -> type:
    """A TRL environment class running ``env_cls`` (an agentrl :class:`~agentrl.environment.base.Environment`)."""
    import inspect

    def _tool(name: str, fn: Any) -> Any:
        def method(self: Any, **arguments: Any) -> str:
            return self._loop.run_until_complete(self._env.call_tool(name, arguments))

        method.__name__ = method.__qualname__ = name
        method.__doc__ = fn.__doc__
        method.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
        method.__annotations__ = dict(getattr(fn, "__annotations__", {}))
        return method

    class Adapter:
        def __init__(self) -> None:
            self._loop = asyncio.new_event_loop()
            self._env = env_cls()

        def reset(self, task: str, **_: Any) -> None:
            self._env = env_cls()
            self._loop.run_until_complete(self._env.reset(json.loads(task)))

        def _reward(self, messages: list[dict[str, Any]]) -> float:
            result = self._loop.run_until_complete(self._env.reward(messages))
            return float(result["reward"] if isinstance(result, dict) else result)

    for name, spec in env_cls.tool_specs().items():
        setattr(Adapter, name, _tool(name, getattr(env_cls, spec.attr)))
    Adapter.__name__ = f"{env_cls.__name__}ForTRL"
    return Adapter


def main(spec_path: str) -> int:
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    spec = json.loads(Path(spec_path).read_text())
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    from agentrl.environment.registry import load_env

    env_cls = load_env(spec["env"])
    schemas = env_cls.tool_schemas()
    torch.manual_seed(spec["seed"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    tokenizer.chat_template = spec["chat_template"]  # the template agentrl renders with (its own or a built-in)
    tokenizer.response_template = qwen3_template
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    model.generation_config.eos_token_id = list(spec["stop_token_ids"])  # every token that ends a turn for agentrl
    rows = [{"prompt": p, "task": json.dumps(t)} for p, t in zip(spec["prompts"], spec["tasks"], strict=True)]
    steps: list[dict[str, float]] = []

    def reward(prompts: list[Any], completions: list[Any], environments: list[Any], **_: Any) -> list[float]:
        return [env._reward(list(p) + list(c)) for p, c, env in zip(prompts, completions, environments, strict=True)]

    class Timed(GRPOTrainer):
        def _generate(self, prompts: list) -> Any:
            t0 = time.perf_counter()
            out = super()._generate(prompts)
            _prompt_ids, completion_ids, tool_mask = out[0], out[1], out[2]
            tokens = sum(sum(m) for m in tool_mask) if tool_mask is not None else sum(len(c) for c in completion_ids)
            steps[-1]["gen_s"] += time.perf_counter() - t0
            steps[-1]["model_tokens"] += tokens
            steps[-1]["batch_tokens"] += sum(len(p) for p in out[0]) + sum(len(c) for c in completion_ids)
            steps[-1]["episodes"] += len(completion_ids)
            return out

    class Clock(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            steps.append({"begin": time.perf_counter(), "gen_s": 0.0, "model_tokens": 0, "batch_tokens": 0,
                          "episodes": 0})

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            steps[-1]["end"] = time.perf_counter()

    config = GRPOConfig(**spec["trl_config"])
    peft_config = None
    if spec.get("peft"):  # the adapter agentrl trains (settings.trl_peft), through peft
        from peft import LoraConfig

        peft_config = LoraConfig(**spec["peft"])
    trainer = Timed(model=model, reward_funcs=[reward], args=config, train_dataset=Dataset.from_list(rows),
                    processing_class=tokenizer, environment_factory=_environment_class(env_cls),
                    callbacks=[Clock()], peft_config=peft_config)
    # the environment's own schemas, for rendering the prompts and parsing the calls (execution still goes
    # through the adapter's methods, looked up by name)
    trainer._env_tools = {name: list(schemas) for name in trainer._env_tools}
    rendered = [list(tokenizer.apply_chat_template(
        conversation=[p], tools=schemas, chat_template=trainer.chat_template, add_generation_prompt=True,
        tokenize=True, return_dict=True, **trainer.chat_template_kwargs)["input_ids"][0])
        for p in spec["prompts"][: len(spec["prompt_ids"])]]
    trainer.train()
    final = Path(spec["out_dir"]) / ("final_adapter" if peft_config is not None else "final_model")
    trainer.save_model(str(final))  # a peft adapter directory when it trained one
    tokenizer.save_pretrained(str(final))
    logs = [r for r in trainer.state.log_history if "reward" in r]
    result = {
        "framework": "trl", "trl_version": trl.__version__,
        "generation": "vllm colocate" if config.use_vllm else "transformers generate",
        "steps": [{"s": s["end"] - s["begin"], "gen_s": s["gen_s"], "model_tokens": s["model_tokens"],
                   "batch_tokens": s["batch_tokens"], "episodes": s["episodes"]} for s in steps if "end" in s],
        "loop_s": steps[-1]["end"] - steps[0]["begin"],
        "rewards": [r["reward"] for r in logs],
        "tool_calls_per_episode": [r.get("tools/call_frequency") for r in logs],
        "final_model": str(final),
        "same_prompt_ids": rendered == spec["prompt_ids"],
    }
    Path(spec["result"]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1]))
