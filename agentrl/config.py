"""Typed run configuration, loadable from TOML, with one docstring per field.

Precedence: defaults < the environment's preset (``agentrl.presets``) < TOML file (``--config run.toml``) < command-line flags.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentrl.inference.server import VLLMServerConfig
from agentrl.orchestrator import PipelineConfig
from agentrl.presets import preset_for
from agentrl.rollout import SamplingConfig
from agentrl.trainer.config import TrainerConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_MODEL = "models/tiny"
"""The embedded default model, built on demand by ``agentrl model tiny``."""


class RunConfig(BaseModel):
    """Everything one training run needs."""

    model_config = ConfigDict(extra="forbid")

    name: str = "calc"
    """Run name: outputs go to ``<output_dir>/<name>/``."""
    output_dir: Path = Path("runs")
    """Parent directory of run directories."""
    env: str = "calc"
    """Environment name (``calc``), or ``package.module:Class``."""
    env_url: str | None = None
    """Base URL of an ``agentrl serve-env`` server: ``env`` then runs there, through ``RemoteEnvironment``."""
    env_token: str | None = Field(None, exclude=True, repr=False)
    """Bearer token for ``env_url`` (default: ``$AGENTRL_ENV_TOKEN``); never written to the run directory."""
    tasks: Path | None = None
    """JSONL file of training tasks; default: the environment's own train split."""
    eval_tasks: Path | None = None
    """JSONL file of held-out tasks; default: the environment's own test split."""
    model: str = DEFAULT_MODEL
    """Hugging Face model directory (or hub id where a hub is reachable). The default is built if missing."""
    mode: Literal["sync", "async"] = "sync"
    """``sync``: generate a batch, train, then sync. ``async``: generation and training overlap, with
    rollouts at most ``pipeline.max_staleness`` versions behind (same code path, η = 0 for sync)."""
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    """Staleness bound, drop policy, update mode and weight-sync method (see ``agentrl.orchestrator``)."""
    steps: int = Field(80, ge=1)
    """Number of optimizer steps."""
    tasks_per_step: int = Field(16, ge=1)
    """Tasks (GRPO groups) per step."""
    group_size: int = Field(8, ge=1)
    """Rollouts per task (G); advantages are normalised within each group."""
    max_concurrency: int = Field(128, ge=1)
    """Episodes in flight at once, across all groups."""
    seed: int = 0
    """Seed for task sampling (the trainer and engine have their own seeds)."""
    time_limit_min: float | None = Field(None, gt=0)
    """Stop training after this many minutes of wall time (checked between steps)."""
    eval_every: int = Field(10, ge=0)
    """Evaluate on held-out tasks every N steps (0: only before and after training)."""
    eval_size: int = Field(200, ge=1)
    """Held-out tasks per evaluation."""
    eval_temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature for evaluation (1.0: success of the policy as it samples)."""
    checkpoint_every: int = Field(20, ge=0)
    """Save a resumable checkpoint every N steps (0: never)."""
    engine_warmup: bool = True
    """Before the first evaluation, send one burst of ``max_concurrency`` throwaway generations, so that
    the engine's slow first batch (lazy kernel set-up) does not count against the evaluation's episode
    wall clocks (see ``agentrl.inference.warmup``)."""
    keep_failed: bool = False
    """Train on failed episodes (env/inference errors) too. Default: they are logged but not trained on."""
    nproc: int = Field(1, ge=1)
    """Trainer processes (torchrun --nproc_per_node)."""
    endpoints: list[str] = Field(default_factory=list)
    """Existing inference servers to use; empty: start one local vLLM server."""
    adapter_name: str = "policy"
    """Name of the LoRA adapter slot in the engine."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """Rollout sampling."""
    trainer: TrainerConfig = Field(default_factory=lambda: TrainerConfig(model_path=DEFAULT_MODEL))
    """Trainer (FSDP2, LoRA, loss)."""
    inference: VLLMServerConfig = Field(default_factory=lambda: VLLMServerConfig(model=DEFAULT_MODEL))
    """The local vLLM server, when ``endpoints`` is empty."""

    @property
    def run_dir(self) -> Path:
        return self.output_dir / self.name

    def resolved(self) -> RunConfig:
        """A copy where the trainer and server point at ``model`` and the context lengths agree."""
        cfg = self.model_copy(deep=True)
        cfg.trainer.model_path = cfg.model
        cfg.inference.model = cfg.model
        cfg.sampling.max_context_tokens = min(cfg.sampling.max_context_tokens, cfg.inference.max_model_len)
        return cfg


def _deep_update(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in new.items():
        out[k] = _deep_update(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_config(path: Path | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Defaults, then the environment's preset, then the TOML file, then ``overrides`` (nested dicts; ``None`` values are ignored)."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {path} does not exist")
        with path.open("rb") as f:
            data = tomllib.load(f)
    clean = {k: v for k, v in (overrides or {}).items() if v is not None}
    env = clean.get("env", data.get("env", "calc"))
    merged = _deep_update(_deep_update(preset_for(env), data), clean)
    model = merged.get("model", DEFAULT_MODEL)
    for section, key in (("trainer", "model_path"), ("inference", "model")):
        if isinstance(merged.get(section), dict):
            merged[section].setdefault(key, model)
    return RunConfig.model_validate(merged)
