"""The model card (``README.md``) of a run's final adapter or model: what it was trained from, on what, how,
how well it does on held-out tasks before and after, and how to load it with peft, transformers and vLLM.
Nothing is uploaded: the directory is ready for ``huggingface-cli upload`` or ``push_to_hub``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.core.utils.stats import binomial_stderr

if TYPE_CHECKING:  # pragma: no cover
    from agentrl.config.run import RunConfig

CARD_FILE = "README.md"


def _hub_id(model: str) -> str | None:
    """``model`` when it reads as a hub id (``owner/name``, not a local directory): the card's ``base_model``.
    The embedded models' directory (``models/tiny``, built on demand) is local even before it exists."""
    from agentrl.config.run import DEFAULT_MODEL

    parts = model.split("/")
    embedded = parts[0] == Path(DEFAULT_MODEL).parent.name
    return model if len(parts) == 2 and all(parts) and not embedded and not Path(model).exists() else None


def _success(rec: dict[str, Any] | None) -> str:
    if rec is None or rec.get("success") is None:
        return "n/a"
    p, n = float(rec["success"]), int(rec.get("num_episodes") or 0)
    se = binomial_stderr(p, n)
    err = f" ± {se:.3f}" if se is not None else ""
    return f"{p:.3f}{err} (n = {n})"


def model_card(cfg: RunConfig, *, first_eval: dict[str, Any] | None, last_eval: dict[str, Any] | None,
               steps: int, wall_s: float | None, run_id: str, form: str = "trained", path: str | None = None,
               dtype: str | None = None) -> str:
    """The card's markdown (YAML front matter, then sections) for the run of ``cfg``. ``form``: what the
    directory holds: what the run saved (``trained``), or an ``agentrl export`` of it: its LoRA adapter merged
    into the base model's weights in ``dtype`` (``merged``) or the adapter alone (``adapter``); ``path``: the
    directory's name in the card's commands (default: the run's own saved policy)."""
    t = cfg.trainer
    merged = form == "merged" and t.lora
    lora = t.lora and not merged
    base = cfg.model
    hub = _hub_id(base)
    path = path or cfg.final_policy_dir.name
    tags = ["agentrl", "reinforcement-learning", "grpo", f"env:{cfg.env}"] + (["lora", "peft"] if lora else [])
    front = ["---", *([f"base_model: {hub}"] if hub else []), f"library_name: {'peft' if lora else 'transformers'}",
             "pipeline_tag: text-generation", "tags:", *[f"- {x}" for x in tags], "---"]
    adapter = f"a LoRA adapter (rank {t.lora_rank}, alpha {t.lora_alpha:g}, on {', '.join(t.lora_modules)})"
    what = adapter if lora else "the full weights"
    if merged:
        what = f"the full weights, {adapter} merged into them ({dtype or 'float32'})"
    loss = t.loss
    rows = [
        ("base model", f"`{base}`"), ("environment", f"`{cfg.env}`"), ("trained", what),
        ("steps", f"{steps} (of {cfg.steps}), {cfg.tasks_per_step} tasks x {cfg.group_size} rollouts per step"),
        ("mode", f"{cfg.mode} (max staleness {cfg.pipeline.max_staleness})"),
        ("loss", f"GRPO-family, clip [{loss.clip_low:g}, {loss.clip_high:g}], {loss.aggregation}, "
                 f"importance correction {loss.is_correction}, ratio level {loss.ratio_level}"),
        ("optimizer", f"AdamW, lr {t.lr:g}, {t.dtype}"),
        ("sampling", f"temperature {cfg.sampling.temperature:g}, context {cfg.sampling.max_context_tokens} tokens"),
        ("run", f"`{run_id}`" + (f", {wall_s / 60:.1f} min wall time" if wall_s else "")),
    ]
    eval_t = cfg.eval_temperature
    tasks = cfg.eval_tasks or f"the environment's test split (first {cfg.eval_size})"
    lines = [
        *front, "",
        f"# {cfg.env} agent ({cfg.run_dir.name})", "",
        f"Trained with agentrl by reinforcement learning on the `{cfg.env}` "
        f"environment: multi-turn episodes with tool calls, rewarded by the environment. This directory holds "
        f"{what} of `{base}`.", "",
        "## Training", "", "| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows], "",
        "## Held-out success", "",
        f"One episode per held-out task ({tasks}), sampled at temperature {eval_t:g}; success = reward >= 1 "
        "(± one standard error).", "",
        "| | success |", "|---|---|",
        f"| before training (step {first_eval['step'] if first_eval else '-'}) | {_success(first_eval)} |",
        f"| after training (step {last_eval['step'] if last_eval else '-'}) | {_success(last_eval)} |", "",
        "## Use it", "",
    ]
    if lora:
        lines += [
            "With peft and transformers:", "", "```python",
            "from peft import PeftModel",
            "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
            f'base = AutoModelForCausalLM.from_pretrained("{base}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{base}")',
            f'model = PeftModel.from_pretrained(base, "{path}")',
            "merged = model.merge_and_unload()  # optional: plain transformers weights", "```", "",
            "With vLLM:", "", "```bash",
            f"vllm serve {base} --enable-lora --max-lora-rank {t.lora_rank} --lora-modules policy={path}",
            "```", "", "```python",
            "from vllm import LLM, SamplingParams",
            "from vllm.lora.request import LoRARequest", "",
            f'llm = LLM("{base}", enable_lora=True, max_lora_rank={t.lora_rank})',
            f'out = llm.chat(messages, SamplingParams(temperature=1.0), lora_request=LoRARequest("policy", 1, "{path}"))',
            "```", "",
        ]
    else:
        lines += [
            "With transformers:", "", "```python",
            "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
            f'model = AutoModelForCausalLM.from_pretrained("{path}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{path}")', "```", "",
            "With vLLM (its tool calls parsed as training parsed them):", "", "```bash",
            f"vllm serve {path} --enable-auto-tool-choice --tool-call-parser {cfg.tool_parser}", "```", "",
        ]
    eval_cmd = (f"agentrl eval --adapter {path}" if form == "trained" or lora
                else f"agentrl eval --env {cfg.env} --model {path}")
    lines += [
        f"Evaluate it again with agentrl: `{eval_cmd}`", "",
        "## Configuration", "",
        "The run's resolved configuration (`agentrl train --config` takes it back):", "",
        "```toml", cfg.to_toml(), "```", "",
    ]
    return "\n".join(lines)


def write_model_card(out_dir: Path, cfg: RunConfig, **kwargs: Any) -> Path:
    """Write :func:`model_card` to ``out_dir/README.md``; returns its path."""
    path = Path(out_dir) / CARD_FILE
    path.write_text(model_card(cfg, **kwargs))
    return path
