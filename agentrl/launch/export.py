"""``agentrl export``: a trained policy as a plain Hugging Face model directory that any stack serves (``vllm
serve DIR``, transformers, a hub), or as a peft adapter (``--adapter-only``).

The directory holds:

- the weights: a LoRA adapter merged into its base model in float32 (``W0 + scaling * B @ A``, peft's merge;
  the tensors trained whole beside it replace the base's), then cast to ``dtype``; a full-weight run's model
  cast the same way;
- the chat template the run trained with (``chat_template.jinja``, which transformers and vLLM read) and the
  tokenizer of the base;
- ``generation_config.json``, whose ``eos_token_id`` lists the tokens that ended a turn in training (the
  template's end of turn, the tokenizer's eos and the base's own) and whose sampling defaults are the run's;
- ``README.md``, a model card with the run's figures (held-out success before and after, steps, its config),
  and ``agentrl_policy.json``, the description ``agentrl eval --adapter`` reads.

An existing non-empty ``out`` is refused; the directory is written beside it and renamed into place, so a
failure leaves nothing half-written.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from agentrl.core.errors import ConfigError
from agentrl.core.utils.atomic import replace_dir
from agentrl.launch.described import POLICY_FILE, NotAPolicy, SavedPolicy, read_policy
from agentrl.rollout import templates

DTYPES = ("float32", "bfloat16", "float16")
"""The dtypes an export may be written in."""

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


class ExportOutOccupied(ConfigError, ValueError):
    """``agentrl export --out`` names a directory that already holds files."""

    code = "config.export_out_occupied"


class UnknownDtype(ConfigError, ValueError):
    """``agentrl export --dtype`` names no dtype an export may be written in."""

    code = "config.export_dtype"


def merge_into(base: str | Path, adapter: str | Path, dtype: str = "float32") -> Any:
    """The peft LoRA ``adapter`` merged into the model ``base`` in float32, cast to ``dtype`` (a transformers
    model, in memory). An adapter with an output-layer LoRA unties a tied output layer first."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from agentrl.weight_sync.saved import carries_output_lora

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if carries_output_lora(adapter) and head is not None and head.weight is embedding.weight:
        # the output layer's LoRA changes the logits only: merged into a tied weight it would change the input
        # embedding too, so the exported model gets an output layer of its own
        head.weight = torch.nn.Parameter(head.weight.detach().clone())
        model.config.tie_word_embeddings = False
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    return merged.to(getattr(torch, dtype))


def save_model(model: Any, src: str | Path, out: Path) -> None:
    """``model``'s weights and config at ``out`` (safetensors), with the tokenizer files, chat template and
    generation config of the model directory ``src``."""
    from agentrl.trainer.model import copy_model_files

    model.config.use_cache = True
    model.save_pretrained(str(out), safe_serialization=True)
    copy_model_files(Path(src), out)


def export(source: str | Path, out: str | Path, *, dtype: str = "float32", adapter_only: bool = False) -> dict[str, Any]:
    """Write the saved policy at ``source`` (a run directory, an adapter or a final model) to ``out`` (see the
    module docstring); returns what was written (for the command's JSON line)."""
    if dtype not in DTYPES:
        raise UnknownDtype(f"--dtype {dtype}: expected one of {', '.join(DTYPES)}")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportOutOccupied(f"{out} already exists and is not empty: export into a new or empty directory")
    saved = read_policy(source)
    if adapter_only and saved.kind != "adapter":
        raise NotAPolicy(f"--adapter-only: {saved.path} is a whole model, not a LoRA adapter")
    settings = saved.settings()
    base = settings["model"]
    if not adapter_only:
        from agentrl.launch.stack import ensure_model

        ensure_model(base)  # the embedded model's default directory is installed on demand, as a run does
    saved.check_base(base)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if adapter_only:
            _write_adapter(saved, base, tmp)
        else:
            save_model(merge_into(base, saved.path, dtype) if saved.kind == "adapter" else _whole(saved.path, dtype),
                       base, tmp)
        template = _write_template(settings.get("chat_template"), tmp)
        stops = [] if adapter_only else _write_generation_config(tmp, base, settings)
        _write_card(saved, tmp, out.name, dtype=dtype, adapter_only=adapter_only)
        _write_record(saved, tmp, dtype=dtype, adapter_only=adapter_only)
        out.parent.mkdir(parents=True, exist_ok=True)
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"out": str(out), "from": str(saved.path), "base": base, "merged": not adapter_only and saved.kind == "adapter",
            "dtype": None if adapter_only else dtype, "chat_template": saved.config.get("chat_template") or template,
            "stop_token_ids": stops}


def _whole(model: Path, dtype: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model), dtype=getattr(torch, dtype))


def _write_adapter(saved: SavedPolicy, base: str, out: Path) -> None:
    """The peft adapter's files, its config naming ``base`` as its base model."""
    for name in ADAPTER_FILES:
        if (saved.path / name).is_file():
            shutil.copy2(saved.path / name, out / name)
    config = json.loads((out / "adapter_config.json").read_text())
    (out / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": base}, indent=2))


def _write_template(spec: str | None, out: Path) -> str | None:
    """The run's chat template into ``out`` (nothing where it trained with the model's own, which the copied
    tokenizer files carry); returns its label."""
    template = templates.resolve(spec)
    if template is None:
        return None
    (out / templates.TEMPLATE_FILE).write_text(template.text)
    return template.label


def _write_generation_config(out: Path, base: str, settings: dict[str, Any]) -> list[int]:
    """``generation_config.json``: the base's, with the turn-ending tokens of training as ``eos_token_id`` and
    the run's sampling as the defaults; returns those tokens."""
    from transformers import AutoTokenizer

    from agentrl.rollout.chat import ChatFormat

    chat = ChatFormat(AutoTokenizer.from_pretrained(str(out)), settings.get("tool_parser", "hermes"), model_dir=base)
    path = out / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    config["eos_token_id"] = chat.stop_token_ids
    if "sampling.temperature" in settings:  # top_k 0 is "off" to transformers and vLLM (transformers' default: 50)
        config.update({"do_sample": settings["sampling.temperature"] > 0, "temperature": settings["sampling.temperature"],
                       "top_p": settings.get("sampling.top_p", 1.0), "top_k": settings.get("sampling.top_k", 0)})
        if settings.get("sampling.min_p"):
            config["min_p"] = settings["sampling.min_p"]
    path.write_text(json.dumps(config, indent=2))
    return chat.stop_token_ids


def _write_card(saved: SavedPolicy, out: Path, name: str, *, dtype: str, adapter_only: bool) -> None:
    from agentrl.config.run import RunConfig
    from agentrl.tracking.card import CARD_FILE, model_card

    if not saved.config:
        (out / CARD_FILE).write_text(f"# {name}\n\nExported by agentrl from `{saved.path}`; no run describes it.\n")
        return
    f = saved.figures
    form = "adapter" if adapter_only else ("merged" if saved.kind == "adapter" else "trained")
    (out / CARD_FILE).write_text(model_card(
        RunConfig.model_validate(saved.config), first_eval=f.get("first_eval"), last_eval=f.get("last_eval"),
        steps=f.get("steps") or 0, wall_s=f.get("wall_s"), run_id=f.get("run_id") or "-", form=form, path=name,
        dtype=dtype))


def _write_record(saved: SavedPolicy, out: Path, *, dtype: str, adapter_only: bool) -> None:
    """The policy's description, with what the export did, so that the export describes itself too."""
    src = saved.path / POLICY_FILE
    record = json.loads(src.read_text()) if src.is_file() else {"format": 1, "config": saved.config,
                                                                  "figures": saved.figures,
                                                                  "base": {"model": saved.base}}
    record["exported"] = {"from": str(saved.path), "merged": not adapter_only and saved.kind == "adapter",
                          "dtype": None if adapter_only else dtype}
    (out / POLICY_FILE).write_text(json.dumps(record, indent=2, default=str))
