"""Build the (LoRA) causal LM under FSDP2, and move its state in and out (adapters, checkpoints)."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from agentrl.config.trainer import TrainerConfig
from agentrl.core.errors import AgentRLError, ConfigError
from agentrl.core.utils.atomic import replace_dir
from agentrl.trainer.errors import TrainerSettingError

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)


class NoGpuForRank(ConfigError, RuntimeError):
    """A trainer rank has no GPU of its own: more ranks on this host than visible GPUs."""

    code = "config.trainer_gpus"


class NoDecoderLayers(ConfigError, RuntimeError):
    """The model has no decoder layers to shard: its class lists none in ``_no_split_modules``."""

    code = "config.no_decoder_layers"


class CheckpointLoraMismatch(ConfigError, ValueError):
    """The checkpoint was saved with ``trainer.lora`` set otherwise than this trainer's."""

    code = "config.checkpoint_lora"


class CheckpointMismatch(AgentRLError, RuntimeError):
    """The checkpoint's state does not fit the model: trained weights are missing from it, or it holds others."""

    code = "trainer.checkpoint_mismatch"


def resolve_device(cfg: TrainerConfig, local_rank: int) -> torch.device:
    """The device of this rank: ``cuda:<local_rank>`` or ``cpu``."""
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        if local_rank >= torch.cuda.device_count():
            raise NoGpuForRank(f"local rank {local_rank} has no GPU ({torch.cuda.device_count()} visible)")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks: modules whose class the HF model lists in ``_no_split_modules``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise NoDecoderLayers(f"no decoder layers found in {type(base).__name__} (looked for {sorted(names)})")
    return layers


def attn_implementation(cfg: TrainerConfig) -> str:
    """The attention implementation the model is built with: ``cfg.attn_implementation``, except that packed
    rows under ``sdpa`` use :data:`agentrl.trainer.attention.VARLEN_SDPA` (SDPA per sample rather than over
    a dense block-diagonal mask)."""
    if cfg.packing and cfg.attn_implementation == "sdpa":
        from agentrl.trainer.attention import register

        return register()
    return cfg.attn_implementation


MLP_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
NORMS = ("norm",)
"""``trainer.lora_train_norms``: peft's ``modules_to_save`` names, matched as name endings: every
``...layernorm``, ``...norm`` (the final norm, Qwen3's ``q_norm``/``k_norm``) of the model."""


def lora_targets(names: list[str], config: Any) -> list[str]:
    """The LoRA target names for a model of ``config``: ``names``, less the MLP projections on a
    mixture-of-experts model. There peft would match them to the experts' fused weight tensors, which
    agentrl's adapter sync and merge do not carry, so a MoE adapter covers attention (as it always did)."""
    from agentrl.moe.families import moe_info

    if moe_info(config) is None:
        return list(names)
    kept = [n for n in names if n not in MLP_PROJECTIONS]
    if not kept:
        raise TrainerSettingError(f"lora_target_modules = {names}: on a mixture-of-experts model LoRA covers attention "
                         "only (q_proj, k_proj, v_proj, o_proj); name at least one of those")
    return kept


def _causal_lm(cfg: TrainerConfig, on_meta: bool) -> nn.Module:
    """The HF model with LoRA added (seeded): its weights loaded from ``cfg.model_path``, or on the meta
    device (shapes only, no memory)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if on_meta:
        config = AutoConfig.from_pretrained(cfg.model_path)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(
                config, dtype=torch.float32, attn_implementation=attn_implementation(cfg)
            )
    else:
        model = AutoModelForCausalLM.from_pretrained(
            cfg.model_path, dtype=torch.float32, attn_implementation=attn_implementation(cfg)
        )
    model.config.use_cache = False
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.lora:
        from peft import LoraConfig, get_peft_model

        lora_cfg = LoraConfig(
            r=cfg.lora_rank,
            lora_alpha=cfg.lora_alpha,
            lora_dropout=cfg.lora_dropout,
            target_modules=lora_targets(cfg.lora_modules, model.config),
            modules_to_save=list(NORMS) if cfg.lora_train_norms else None,
            task_type="CAUSAL_LM",
        )
        torch.manual_seed(cfg.seed)
        with untied_output_lora():
            model = get_peft_model(model, lora_cfg)
        if cfg.lora_train_embedding:  # the output layer too, where it is tied (one parameter)
            model.get_input_embeddings().weight.requires_grad_(True)
    else:
        freeze(model, cfg.frozen_parameters)
    return model


@contextlib.contextmanager
def untied_output_lora() -> Iterator[None]:
    """Within the block, peft's warning that a LoRA on a tied output layer is not tied to the input embedding
    is not shown: ``lora_train_unembed`` (and Tinker's ``train_unembed``) mean exactly that, the logits' update
    alone (peft's ``ensure_weight_tying`` would give the input embedding the same update)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*ensure_weight_tying", category=UserWarning)
        yield


def trained_whole(model: nn.Module) -> set[str]:
    """The names of the parameters a LoRA model trains whole beside its adapter: peft's ``modules_to_save``
    (``trainer.lora_train_norms``) and the input embedding (``trainer.lora_train_embedding``; the output layer
    with it where the two are tied). Empty for a model without an adapter."""
    if not hasattr(model, "peft_config"):
        return set()
    embedding = model.get_input_embeddings().weight
    return {n for n, p in model.named_parameters()
            if p.requires_grad and ("modules_to_save" in n or p is embedding)}


def adapter_state(model: nn.Module, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What a LoRA model's adapter files hold, from its state dict ``sd``: the adapter's tensors and those
    trained whole beside it, under peft's names (``...q_proj.lora_A.weight``, ``...model.norm.weight``; the
    embedding as peft saves one, ``...model.embed_tokens.weight``)."""
    from peft import get_peft_model_state_dict

    embedding = [n for n in trained_whole(model) if "modules_to_save" not in n]
    # an output-layer LoRA (lora_train_unembed) would make peft's "auto" save the whole (frozen) embedding
    adapter = get_peft_model_state_dict(model, state_dict=sd, save_embedding_layers=False)
    return {**adapter, **{n: sd[n] for n in embedding}}


def optimizer_groups(model: nn.Module) -> list[dict[str, Any]]:
    """The trainable parameters as optimizer groups, each with its share of the scheduled rate
    (``lr_scale``): everything at the rate, except tensors trained whole beside a LoRA adapter
    (:func:`trained_whole`), which get the full-weight rate the adapter's is derived from
    (``1 / LORA_LR_SCALE``)."""
    from agentrl.config.trainer import LORA_LR_SCALE

    names = trained_whole(model)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    whole = [p for n, p in trainable if n in names]
    rest = [p for n, p in trainable if n not in names]
    groups: list[dict[str, Any]] = [{"params": rest, "lr_scale": 1.0}]
    if whole:
        groups.append({"params": whole, "lr_scale": 1.0 / LORA_LR_SCALE})
    return groups


def freeze(model: nn.Module, patterns: list[str]) -> list[str]:
    """Keep the parameters whose name contains one of ``patterns`` out of training; returns their names.
    A pattern that names no parameter is an error (a misspelt name would otherwise train everything)."""
    frozen = [n for n, p in model.named_parameters() if any(s in n for s in patterns)]
    unused = [s for s in patterns if not any(s in n for n in frozen)]
    if unused:
        raise TrainerSettingError(f"trainer.frozen_parameters: {unused} name no parameter of this model "
                         f"(its names look like {next(iter(dict(model.named_parameters())))!r})")
    for name, p in model.named_parameters():
        if name in frozen:
            p.requires_grad_(False)
    return frozen


def _non_persistent_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """Buffers that are not in the state dict (rotary ``inv_freq``...): computed at construction, so
    garbage after ``to_empty``."""
    out = {}
    for prefix, module in model.named_modules():
        for name in module._non_persistent_buffers_set:
            buf = module._buffers.get(name)
            if buf is not None:
                out[f"{prefix}.{name}" if prefix else name] = buf
    return out


def build_model(cfg: TrainerConfig, mesh: DeviceMesh, device: torch.device) -> nn.Module:
    """The (LoRA) model sharded with FSDP2, with the full weights on rank 0 only.

    Rank 0 loads the weights and adds LoRA (seeded); every other rank builds the same model on the meta
    device. All shard it; the other ranks allocate only their own shards on ``device`` and receive them
    from rank 0's weights (one tensor at a time), then the buffers that are not in the state dict.
    """
    rank = dist.get_rank()
    model = _causal_lm(cfg, on_meta=rank != 0)
    full = model.state_dict() if rank == 0 else {}
    mp = None
    if cfg.dtype == "bfloat16":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    kwargs: dict[str, Any] = {"mesh": mesh} if mp is None else {"mesh": mesh, "mp_policy": mp}
    for layer in _decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    if dist.get_world_size() > 1:
        if rank != 0:
            model.to_empty(device=device)
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=True)
        set_model_state_dict(model, full, options=options)
        with torch.no_grad():
            for _, buf in sorted(_non_persistent_buffers(model).items()):
                dist.broadcast(buf, src=0)
    del full
    torch.manual_seed(cfg.seed)  # the same RNG state on every rank, whichever way it built the model
    model.train()
    return model


def _state_options(cfg: TrainerConfig, full: bool) -> StateDictOptions:
    return StateDictOptions(full_state_dict=full, cpu_offload=full, ignore_frozen_params=cfg.lora)


def gather_trainable(model: nn.Module, cfg: TrainerConfig) -> dict[str, torch.Tensor]:
    """Collective: the full trainable state on rank 0's CPU (empty on other ranks).

    LoRA: the adapter tensors under peft's file key names (``...q_proj.lora_A.weight``, no adapter
    name), and the tensors trained whole beside it (``...model.norm.weight``,
    ``...model.embed_tokens.weight``: peft's names for them). Full fine-tune: the whole model state dict under
    the HF key names.
    """
    live = planned_trainable(model)
    if live is not None:
        return {name: t.to("cpu", copy=True) for name, t in live.items()}
    sd = get_model_state_dict(model, options=_state_options(cfg, full=True))
    if dist.get_rank() != 0:
        return {}
    named = adapter_state(model, sd) if cfg.lora else sd
    if cfg.lora and dist.get_world_size() == 1:
        setattr(model, GATHER_PLAN, _gather_plan(model, sd, named))
    return {k: v.detach().contiguous() for k, v in named.items()}


GATHER_PLAN = "_agentrl_gather_plan"
"""The attribute that keeps, after a single-rank LoRA model's first :func:`gather_trainable`, each returned name
with the parameter it is read from: later gathers copy those parameters' local tensors (the one rank's shard is
the whole tensor) instead of building a state dict (on SmolLM2's 420 adapter tensors at rank 16: 11-20 ms
instead of about 140, most of it the state dict and peft's renaming). Full weights keep the state dict, whose
CPU tensors are the parameters themselves, not a second copy of the model."""


def planned_trainable(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """A single-rank LoRA model's trainable tensors under :func:`gather_trainable`'s names, as views of the live
    parameters (no copy: read them before the next step), once a first gather made the plan; None before that,
    or on several ranks."""
    plan: list[tuple[str, str]] | None = getattr(model, GATHER_PLAN, None)
    if plan is None or dist.get_world_size() != 1:
        return None
    params = dict(model.named_parameters())
    return {out: _local(params[src]) for out, src in plan}


def _local(p: torch.Tensor) -> torch.Tensor:
    """Parameter ``p``'s local tensor, detached (a single-rank DTensor's local shard is the whole tensor)."""
    return (p.to_local() if isinstance(p, DTensor) else p).detach()


def _gather_plan(model: nn.Module, sd: dict[str, torch.Tensor],
                 named: dict[str, torch.Tensor]) -> list[tuple[str, str]] | None:
    """``(returned name, parameter name)`` for every tensor of ``named`` (taken from the state dict ``sd`` under
    possibly other names), or None where one is not a parameter of the same name and shape (then every gather
    builds the state dict)."""
    source = {id(v): k for k, v in sd.items()}
    params = dict(model.named_parameters())
    plan = []
    for out, v in named.items():
        src = source.get(id(v))
        p = params.get(src) if src is not None else None
        if p is None or tuple(p.shape) != tuple(v.shape):
            return None
        plan.append((out, src))
    return plan


def _save_full_model(model: nn.Module, state: dict[str, torch.Tensor], out: Path, src: Path) -> None:
    """Rank 0: a whole Hugging Face model directory at ``out`` that transformers and vLLM load: the weights,
    ``config.json`` (with the KV cache switched back on: it is off only for training), the source model's own
    ``generation_config.json`` when it has one, and its tokenizer files and chat template."""
    model.config.use_cache = True
    try:
        model.save_pretrained(str(out), state_dict=state, safe_serialization=True)
    finally:
        model.config.use_cache = False
    copy_model_files(src, out)


def copy_model_files(src: Path, out: Path) -> None:
    """Beside weights saved at ``out``: the tokenizer files and chat template of the model directory ``src``
    (those ``out`` lacks), and its own ``generation_config.json`` verbatim, over the one ``save_pretrained``
    derives."""
    for name in TOKENIZER_FILES:
        if (src / name).is_file() and not (out / name).exists():
            shutil.copy2(src / name, out / name)
    if (src / "generation_config.json").is_file():
        shutil.copy2(src / "generation_config.json", out / "generation_config.json")


def save_adapter(model: nn.Module, cfg: TrainerConfig, path: str | Path) -> int:
    """Collective: write a vLLM/peft-loadable adapter (LoRA) or a full HF model directory at ``path``.

    Rank 0 writes into a temporary sibling and renames it, so readers never see a half-written
    directory. Returns the number of bytes written (0 on other ranks).
    """
    from safetensors.torch import save_file

    state = gather_trainable(model, cfg)
    if dist.get_rank() != 0:
        return 0
    path = Path(path).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    if cfg.lora:
        peft_cfg = copy.deepcopy(model.peft_config["default"])
        peft_cfg.inference_mode = True
        peft_cfg.base_model_name_or_path = cfg.model_path
        peft_cfg.save_pretrained(str(tmp))
        save_file(state, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
    else:
        _save_full_model(model, state, tmp, Path(cfg.model_path))
    size = sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file())
    replace_dir(tmp, path)
    return size


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    model: nn.Module, optimizer: torch.optim.Optimizer, cfg: TrainerConfig, path: str | Path, optimizer_step: int
) -> None:
    """Collective: sharded (DCP) checkpoint of trainable params + optimizer, its step count and RNGs (the
    policy version is the orchestrator's: it keeps it in its own ``state.json``)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    msd, osd = get_state_dict(model, optimizer, options=_state_options(cfg, full=False))
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(path))
    rank = dist.get_rank()
    torch.save(_rng_state(), path / f"rng_rank{rank}.pt")
    dist.barrier()
    if rank == 0:
        meta = {"optimizer_step": optimizer_step, "world_size": dist.get_world_size(), "lora": cfg.lora}
        (path / "agentrl_meta.json").write_text(json.dumps(meta))


def load_checkpoint(
    model: nn.Module, optimizer: torch.optim.Optimizer, cfg: TrainerConfig, path: str | Path
) -> int:
    """Collective: restore a :func:`save_checkpoint` directory (any world size); returns its optimizer step.

    RNG states are restored only for ranks that exist in the checkpoint.
    """
    path = Path(path)
    meta = json.loads((path / "agentrl_meta.json").read_text())
    if bool(meta["lora"]) != cfg.lora:
        raise CheckpointLoraMismatch(f"checkpoint lora={meta['lora']} does not match this trainer's lora={cfg.lora}")
    opts = _state_options(cfg, full=False)
    msd, osd = get_state_dict(model, optimizer, options=opts)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(path))
    # Non-strict: frozen (base) weights are not in a LoRA checkpoint; every trainable one must be.
    loose = StateDictOptions(ignore_frozen_params=cfg.lora, strict=False)
    result = set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=loose
    )
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    missing = [k for k in result.missing_keys if k in trainable]
    if missing or result.unexpected_keys:
        raise CheckpointMismatch(
            f"checkpoint mismatch: missing {missing[:5]}, unexpected {result.unexpected_keys[:5]}"
        )
    rng_file = path / f"rng_rank{dist.get_rank()}.pt"
    if rng_file.is_file():
        _set_rng_state(torch.load(rng_file, weights_only=False))
    return int(meta.get("optimizer_step", meta.get("version", 0)))


def routing_replay(model: nn.Module, cfg: TrainerConfig) -> Any:
    """The MoE routing replay of ``model`` (:class:`agentrl.moe.replay.RoutingReplay`, on with
    ``cfg.routing_replay``), or None for a dense model. A MoE family whose routers agentrl cannot replay
    is refused (``UnsupportedMoE``) rather than trained without replay."""
    from agentrl.moe.families import moe_info
    from agentrl.moe.replay import RoutingReplay

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    info = moe_info(base.config)
    return None if info is None else RoutingReplay(model, info, enabled=cfg.routing_replay)

