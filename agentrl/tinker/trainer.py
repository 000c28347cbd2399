"""The training half: one base model loaded once (float32, in this process) and many named peft LoRA
adapters on it, one per training client, each with its own AdamW. A request switches the active adapter,
so gradients accumulate in that adapter's tensors only, until its ``optim_step``.

``train_attn`` and ``train_mlp`` map to the attention projections (``q_proj``, ``k_proj``, ``v_proj``,
``o_proj``) and the MLP projections (``gate_proj``, ``up_proj``, ``down_proj``); ``train_unembed`` to a LoRA on
the output layer (``lm_head``), which the sampler's engine serves from its slots (vLLM's output-layer LoRA), as
the run trainer's ``lora_train_unembed`` does. On a model that ties the output layer to the input embedding,
it changes the logits only.

Every method runs on the caller's thread and holds the trainer's lock; the service calls them from one
worker thread, in each model's ``seq_id`` order."""

from __future__ import annotations

import json
import math
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.config.trainer import ALL_LINEAR, OUTPUT_LAYER, TrainerConfig
from agentrl.tinker import losses
from agentrl.tinker.errors import TinkerUserError
from agentrl.tinker.wire import WireDatum
from agentrl.trainer.head import fusable, logprob_head
from agentrl.trainer.model import MLP_PROJECTIONS, untied_output_lora

ATTN = tuple(n for n in ALL_LINEAR if n not in MLP_PROJECTIONS)
MLP = MLP_PROJECTIONS
LOGPROB_CHUNK = TrainerConfig.model_fields["logprob_chunk_tokens"].default
"""Positions of the output layer's chunked log-probability at a time (the trainer's default)."""
LORA_ALPHA = 32.0
"""peft's ``lora_alpha`` of every adapter: the update is scaled by ``32 / rank`` (1 at the SDK's rank 32)."""


@dataclass(frozen=True)
class LoraSpec:
    """How a training client's adapter is shaped (the SDK's ``LoraConfig``)."""

    rank: int = 32
    seed: int | None = None
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True

    @property
    def target_modules(self) -> list[str]:
        return [*(ATTN if self.train_attn else ()), *(MLP if self.train_mlp else ()),
                *((OUTPUT_LAYER,) if self.train_unembed else ())]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Adapter:
    spec: LoraSpec
    optimizer: torch.optim.Optimizer
    steps: int = 0


class LoraTrainer:
    """The base model and its adapters, by name (a name is a plain identifier: peft's module key)."""

    def __init__(self, model_dir: Path, *, max_rank: int = 32, device: str | None = None) -> None:
        from transformers import AutoModelForCausalLM

        self.model_dir = Path(model_dir)
        self.max_rank = max_rank
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        """Where the model trains: the first GPU when there is one, else the CPU."""
        self.base = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).to(self.device)
        self.base.config.use_cache = False
        self.base.eval()  # no dropout: a forward pass is a function of the weights
        self.model: Any = None  # the peft model, once the first adapter exists
        self.adapters: dict[str, _Adapter] = {}
        self.lock = threading.Lock()

    # adapters -------------------------------------------------------------------------------------------
    def check(self, spec: LoraSpec) -> None:
        """Refuse an adapter shape this server cannot train and serve."""
        if spec.rank < 1 or spec.rank > self.max_rank:
            raise TinkerUserError(f"LoRA rank {spec.rank}: this server holds ranks 1 to {self.max_rank} "
                                  "(serve-tinker --max-rank)")
        if not spec.target_modules:
            raise TinkerUserError("train_attn, train_mlp and train_unembed are all off: the adapter would train "
                                  "nothing")

    def add(self, name: str, spec: LoraSpec) -> None:
        """A new adapter ``name``, initialised from ``spec.seed`` (B = 0: it starts as the base model)."""
        from peft import LoraConfig, get_peft_model

        self.check(spec)
        cfg = LoraConfig(r=spec.rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=spec.target_modules,
                         task_type="CAUSAL_LM")
        with self.lock, torch.random.fork_rng():
            torch.manual_seed(0 if spec.seed is None else spec.seed)
            with untied_output_lora():
                if self.model is None:
                    self.model = get_peft_model(self.base, cfg, adapter_name=name)
                else:
                    self.model.add_adapter(name, cfg)
            self.model.set_adapter(name)
            params = self._params(name)
            self.adapters[name] = _Adapter(spec, torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12,
                                                                   weight_decay=0.0))

    def remove(self, name: str) -> None:
        with self.lock:
            if self.adapters.pop(name, None) is not None:
                self.model.delete_adapter(name)

    def _params(self, name: str) -> list[torch.nn.Parameter]:
        marks = (f".lora_A.{name}.", f".lora_B.{name}.")
        return [p for n, p in self.model.named_parameters() if any(m in n for m in marks)]

    def _activate(self, name: str) -> _Adapter:
        adapter = self.adapters[name]
        self.model.set_adapter(name)
        return adapter

    # forward / backward ---------------------------------------------------------------------------------
    def _target_logprobs(self, data: list[WireDatum]) -> list[torch.Tensor]:
        n_max = max(len(d.tokens) for d in data)
        ids = torch.zeros((len(data), n_max), dtype=torch.long)
        targets = torch.zeros((len(data), n_max), dtype=torch.long)
        mask = torch.zeros((len(data), n_max), dtype=torch.long)
        vocab = self.base.config.vocab_size
        for i, d in enumerate(data):
            n = len(d.tokens)
            tt = d.inputs["target_tokens"]
            if tt.min(initial=0) < 0 or tt.max(initial=0) >= vocab or d.tokens.min() < 0 or d.tokens.max() >= vocab:
                raise TinkerUserError(f"datum {i}: a token id outside the model's vocabulary (0..{vocab - 1})")
            ids[i, :n] = torch.from_numpy(d.tokens)
            targets[i, :n] = torch.from_numpy(tt.astype(np.int64))
            mask[i, :n] = 1
        ids, mask, targets = ids.to(self.device), mask.to(self.device), targets.to(self.device)
        if fusable(self.model):  # the output layer returns log p(target) per position, never the B x T x V logits
            with logprob_head(self.model, targets, torch.ones(targets.shape, device=self.device), LOGPROB_CHUNK):
                lp = self.model(input_ids=ids, attention_mask=mask).logits[..., 0]
        else:
            logits = self.model(input_ids=ids, attention_mask=mask).logits.float()
            lp = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return [lp[i, : len(d.tokens)] for i, d in enumerate(data)]

    def forward_backward(self, name: str, data: list[WireDatum], loss_fn: str, config: dict[str, float | str],
                         forward_only: bool) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
        """Each datum's target logprobs and the summed loss (``loss:sum``); gradients accumulate into the
        adapter unless ``forward_only``."""
        cfg = losses.resolve_config(loss_fn, config)
        if not data:
            raise TinkerUserError("forward_backward: no data")
        inputs = []
        for i, d in enumerate(data):
            x = {k: torch.from_numpy(np.array(v)) for k, v in d.inputs.items()}
            losses.check_inputs(loss_fn, i, len(d.tokens), x)
            inputs.append({k: v.float().to(self.device) for k, v in x.items() if k != "target_tokens"})
        with self.lock:
            self._activate(name)
            with torch.set_grad_enabled(not forward_only):
                lps = self._target_logprobs(data)
                total = torch.stack([losses.datum_loss(loss_fn, lp, x, cfg) for lp, x in zip(lps, inputs, strict=True)]
                                    ).sum()
                if not forward_only:
                    total.backward()
        outputs = [{"logprobs": lp.detach().cpu().numpy().astype(np.float32)} for lp in lps]
        return outputs, {"loss:sum": float(total.detach())}

    def optim_step(self, name: str, adam: dict[str, float]) -> dict[str, float]:
        """One AdamW step of adapter ``name`` with the SDK's ``AdamParams``; its gradients are cleared after."""
        lr = float(adam.get("learning_rate", 1e-4))
        betas = (float(adam.get("beta1", 0.9)), float(adam.get("beta2", 0.95)))
        eps, wd = float(adam.get("eps", 1e-12)), float(adam.get("weight_decay", 0.0))
        clip = float(adam.get("grad_clip_norm", 0.0))
        if not (lr >= 0 and 0 <= betas[0] < 1 and 0 <= betas[1] < 1 and eps >= 0 and wd >= 0):
            raise TinkerUserError(f"optim_step: AdamParams out of range ({adam})")
        with self.lock:
            adapter = self._activate(name)
            params = self._params(name)
            norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else math.inf)
            for group in adapter.optimizer.param_groups:
                group.update(lr=lr, betas=betas, eps=eps, weight_decay=wd)
            adapter.optimizer.step()
            adapter.optimizer.zero_grad(set_to_none=True)
            adapter.steps += 1
        return {"grad_norm:mean": float(norm), "learning_rate:mean": lr, "step:max": float(adapter.steps)}

    # state ----------------------------------------------------------------------------------------------
    def tensors(self, name: str) -> dict[str, torch.Tensor]:
        """Adapter ``name`` as peft saves it (keys without the adapter name), copied."""
        from peft import get_peft_model_state_dict

        with self.lock:
            sd = get_peft_model_state_dict(self.model, adapter_name=name, save_embedding_layers=False)
            return {k: v.detach().cpu().clone().contiguous() for k, v in sd.items()}

    def save(self, name: str, out: Path, *, optimizer: bool) -> None:
        """A peft adapter directory (``adapter_model.safetensors``, ``adapter_config.json``), with the
        optimizer's state in ``optimizer.pt`` when ``optimizer``."""
        from safetensors.torch import save_file

        out.mkdir(parents=True, exist_ok=True)
        sd = self.tensors(name)
        save_file(sd, str(out / "adapter_model.safetensors"))
        with self.lock:
            cfg = self.model.peft_config[name]
            cfg.base_model_name_or_path = str(self.model_dir)
            cfg.save_pretrained(str(out))
            adapter = self.adapters[name]
            (out / "lora_spec.json").write_text(json.dumps(adapter.spec.to_json()))
            if optimizer:
                torch.save({"optimizer": adapter.optimizer.state_dict(), "steps": adapter.steps}, out / "optimizer.pt")

    def load(self, name: str, src: Path, *, optimizer: bool) -> None:
        """Adapter ``name`` (already added with the checkpoint's shape) takes the weights in ``src``, and its
        optimizer state too when ``optimizer``."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        sd = load_file(str(src / "adapter_model.safetensors"))
        with self.lock:
            result = set_peft_model_state_dict(self.model, sd, adapter_name=name)
            missing = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
            if missing:
                raise TinkerUserError(f"checkpoint {src.name}: {len(missing)} tensors fit no module of this adapter")
            adapter = self.adapters[name]
            if optimizer:
                state = torch.load(src / "optimizer.pt", map_location=self.device, weights_only=False)
                try:
                    adapter.optimizer.load_state_dict(state["optimizer"])
                except ValueError as e:  # another parameter count: saved before train_unembed added lm_head's
                    raise TinkerUserError(f"checkpoint {src.name}: its optimizer state does not fit this adapter "
                                          f"({e}); it was saved for other tensors (before train_unembed put a "
                                          "LoRA on the output layer?): load its weights without the optimizer "
                                          "state") from e
                adapter.steps = int(state["steps"])


def read_spec(src: Path) -> LoraSpec:
    """The adapter shape a checkpoint directory was saved with."""
    return LoraSpec(**json.loads((src / "lora_spec.json").read_text()))
