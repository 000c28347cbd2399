"""Typed run configuration, loadable from TOML, with one docstring per field.

Precedence: defaults < the environment's preset (``agentrl.config.presets``) < TOML file (``--config run.toml``) <
command-line flags. This module is a leaf of the package: it imports only the other config models (no
runtime module, no torch, no vLLM), so every part of agentrl can import it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from agentrl.config.base import Section, given
from agentrl.config.errors import ConfigValidationError, SettingError, validate
from agentrl.config.inference import (
    ENGINE_LORA_RANKS,
    EngineHealthConfig,
    VLLMServerConfig,
    VLLMServerSettings,
    engine_lora_rank,
)
from agentrl.config.placement import PlacementConfig
from agentrl.config.policy import AgentConfig
from agentrl.config.presets import deep_update, is_embedded_model, preset_for, set_dotted, yielding
from agentrl.config.sync import AutoSync, Served, TransportConfig, WeightSyncConfig, refusal, settle
from agentrl.config.tracking import TrackingConfig
from agentrl.config.trainer import TrainerConfig, TrainerSettings
from agentrl.config.window import check_window, given_windows, model_window
from agentrl.core.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_MODEL = "models/tiny"
"""The embedded default model, built on demand by ``agentrl model tiny``."""


class SamplingConfig(Section):
    """How the policy samples during rollouts. Every field is sent with every request, so a model's own
    sampling defaults (its ``generation_config.json``) never change the distribution behind the scenes."""

    temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature. The engine reports logprobs at this temperature and the trainer scales its
    logits by it (each trajectory carries the temperature it was sampled at). Training needs T > 0."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass: sample among the most likely tokens whose probabilities add up to it. Below 1
    the engine records the kept set of every sampled token and the trainer renormalises over it
    (:mod:`agentrl.core.masks`)."""
    top_k: int = Field(0, ge=0)
    """Sample among the k most likely tokens; 0 disables. Recorded and replayed as for ``top_p``."""
    min_p: float = Field(0.0, ge=0.0, lt=1.0)
    """Drop tokens less likely than ``min_p`` times the most likely one; 0 disables. Recorded and replayed as
    for ``top_p``."""
    max_context_tokens: int = Field(2048, ge=16)
    """Prompt plus completion may not exceed this many tokens (the engine's max_model_len). Default: the
    model directory's window (``max_position_embeddings``), or for the embedded tiny model its environment
    preset's (``calc``: 1024); one of the two window settings given sizes the other too."""
    max_parse_errors: int = Field(3, ge=1)
    """Consecutive turns with only malformed tool calls before the episode stops (parse_error)."""

    @property
    def truncates(self) -> bool:
        """Whether sampling cuts the distribution (top-k, top-p or min-p): the engine must record the sets."""
        return self.top_p < 1 or self.top_k > 0 or self.min_p > 0

    def training_problems(self) -> list[str]:
        """Why this sampling cannot be trained on (empty: it can): the trainer computes logprobs of
        ``softmax(logits / temperature)``, renormalised over the engine's recorded kept set where sampling
        truncated."""
        out = []
        if self.temperature <= 0:
            out.append(f"sampling.temperature = {self.temperature}: greedy decoding has no sampling "
                       "distribution to train; use a temperature > 0")
        return out


ASYNC_MAX_STALENESS = 2
"""η of an async run that does not set it. With ``drop_policy = "accept"`` and the token-age cap at η + 2, the
pipeline simulator's tool mix trains 2.67x as fast as sync with 0.7 % of the generated tokens masked for their
age (η 1: 2.11x; η 3: no faster); see ``docs/async.md``, *The async default*."""


class PipelineConfig(Section):
    """How rollouts and training overlap: the staleness bound, the bounded buffer and weight updates."""

    max_staleness: int | None = Field(None, ge=0)
    """η: a group is admitted only while its first token will be at most this many versions behind the
    trainer when its batch is trained in admission order (with ``block`` and ``drop_stale``, a trained group's
    oldest token is at most η versions old). 0 is the synchronous loop (``mode = "sync"``). Default: 0 in
    sync mode, 2 in async mode."""
    drop_policy: Literal["accept", "block", "drop_stale"] = "accept"
    """``accept``: η bounds each group's head at admission; batches are the completed groups admitted
    earliest, taken without waiting for stragglers, and nothing is dropped for staleness (each token's age is
    capped in the loss instead, ``max_token_age``); ``block``: batches are taken in admission order, the
    trainer waiting for stragglers, so nothing goes stale and nothing is dropped; ``drop_stale``: batches are
    taken in completion order, and groups overtaken past η are dropped (counted)."""
    max_token_age: int | None = Field(None, ge=0)
    """Tokens generated more than this many versions before the policy they train (their age: trainer
    version minus the version that produced them) are masked out of the loss and counted
    (``age_capped_tokens``), never trained silently. Default: η + 2."""
    staleness_from: Literal["oldest", "newest"] = "oldest"
    """Which model token of a group its staleness (and so the η bound and ``drop_stale``) is measured from.
    ``oldest``: every trained token is at most η versions old. ``newest``: a group is kept as long as it was
    still generating within η versions, so a long episode continued across weight updates (partial
    rollouts) is trained instead of dropped; its older tokens can be more than η versions old and rely on
    the loss's importance correction (``trainer.loss.is_correction``, capped), which the
    ``staleness_*`` metrics show. With ``drop_stale`` and η = 2 it is the throughput setting for long-tail
    multi-turn workloads (``docs/async.md``: 2.68× over sync on the simulated tool mix, nothing dropped)."""
    capacity_groups: int | None = Field(None, ge=1)
    """Groups in flight plus buffered at most (back-pressure on the producer); default (η + 1) · groups
    per step. Must hold at least one step's groups."""
    update_mode: Literal["keep", "wait"] = "keep"
    """On a weight update: ``keep`` freezes in-flight requests and resumes them under the new weights
    (partial rollouts); ``wait`` lets running requests finish under the old weights first."""
    weight_sync: WeightSyncConfig = Field(default_factory=AutoSync)
    """How the trained policy reaches the engines: a transport (``shm``, ``network``, ``file``, ``merged``,
    ``full``, ``nccl``, or ``auto``, settled when the config is resolved) and its own settings, as a table
    (``[pipeline.weight_sync]`` with ``transport = "merged"``) or a bare name (``weight_sync = "merged"``).
    See :mod:`agentrl.config.sync` for each transport and which runs it can serve."""

    @field_validator("weight_sync", mode="before")
    @classmethod
    def _transport_by_name(cls, value: Any) -> Any:
        """A bare transport name is that transport with its defaults."""
        return {"transport": value} if isinstance(value, str) else value

    @model_validator(mode="before")
    @classmethod
    def _settings_that_moved(cls, data: Any) -> Any:
        """A weight-sync setting of the earlier layout is refused with the setting that holds it now."""
        moved = {"lora_sync": "is gone: name the transport, pipeline.weight_sync = 'merged' (or 'shm' for the LoRA "
                              "slots, or 'auto')",
                 "sync_control": "is now pipeline.weight_sync.control (of the 'shm', 'merged' and 'auto' transports)",
                 "weight_transfer_addr": "is now pipeline.weight_sync.addr (of the 'nccl' transport)"}
        found = [f"pipeline.{k} {v}" for k, v in moved.items() if isinstance(data, dict) and k in data]
        if found:
            raise SettingError("; ".join(found) + " (see agentrl.config.sync)")
        return data

    @classmethod
    def for_async(cls, eta: int | None = None, **given: Any) -> PipelineConfig:
        """An async run's pipeline: the settings ``given`` (None: not given) and the defaults for the rest, η
        included (:data:`ASYNC_MAX_STALENESS`), as ``agentrl train --mode async`` resolves them. The benchmarks
        build their async runs with it, so that with no flags they measure what training runs."""
        return cls(max_staleness=ASYNC_MAX_STALENESS if eta is None else eta,
                   **{k: v for k, v in given.items() if v is not None})

    def token_age_cap(self) -> int:
        """The age past which a token is masked out of the loss: ``max_token_age``, default η + 2."""
        if self.max_staleness is None:
            raise SettingError("pipeline.max_staleness is unresolved: build the config through RunConfig")
        return self.max_staleness + 2 if self.max_token_age is None else self.max_token_age

    def capacity(self, groups_per_step: int) -> int:
        """The buffer capacity in groups for ``groups_per_step`` groups per step."""
        if self.max_staleness is None:
            raise SettingError("pipeline.max_staleness is unresolved: build the config through RunConfig")
        cap = self.capacity_groups or (self.max_staleness + 1) * groups_per_step
        if cap < groups_per_step:
            raise SettingError(f"pipeline.capacity_groups = {cap} cannot hold one step's {groups_per_step} groups")
        return cap


class RunConfig(Section):
    """Everything one training run needs."""

    name: str | None = None
    """Run name: outputs go to ``<output_dir>/<name>/``. An explicit name that holds another run is refused
    (unless resuming it). Default: the environment's registered name, else its class name in lower case,
    with the first free suffix (``calc``, ``calc-2``, ...); see ``agentrl.orchestrator.rundir``."""
    output_dir: Path = Path("runs")
    """Parent directory of run directories."""
    env: str = "calc"
    """Environment: a registered name (``calc``), ``package.module:Class`` (found from the current
    directory too), ``path/to/file.py:Class``, or ``openenv:<url>`` (an OpenEnv server's environment)."""
    env_url: str | None = None
    """Base URL of an ``agentrl serve-env`` server: ``env`` then runs there, through ``RemoteEnvironment``."""
    env_token: str | None = Field(None, exclude=True, repr=False)
    """Bearer token for ``env_url`` (default: ``$AGENTRL_ENV_TOKEN``); never written to the run directory."""
    tasks: str | None = None
    """Training tasks: a JSONL, parquet or CSV file, a saved dataset directory (``save_to_disk``), or a
    Hugging Face hub dataset name (``princeton-nlp/SWE-bench_Lite``); parquet and datasets need ``pip install
    'agentrl[data]'``. Default: the environment's own train split."""
    tasks_split: str | None = None
    """Split of ``tasks`` to train on: for a saved ``DatasetDict`` or a hub dataset, the split to load
    (default: ``train``); for a file or a saved single dataset, the rows whose ``split`` column equals it (a
    source without that column is an error); without ``tasks``, the environment's own split of that name.
    Default: the whole file, or a dataset's ``train`` split."""
    eval_tasks: str | None = None
    """Held-out tasks: a JSONL, parquet or CSV file, a saved dataset directory, or a Hugging Face hub dataset
    name (as ``tasks``). Default: the environment's own test split."""
    eval_tasks_split: str | None = None
    """Split of ``eval_tasks`` (as ``tasks_split``; a dataset's default split here is ``test``)."""
    task_columns: dict[str, str] = Field(default_factory=dict)
    """Task field -> column of the task source, for sources whose columns are named otherwise than the fields
    the environment needs (``task_columns = {question = "prompt"}``; ``--task-column question=prompt``). The
    field gets the column's value; the other columns are kept. Applies to ``tasks`` and ``eval_tasks``."""
    model: str = DEFAULT_MODEL
    """Hugging Face model directory (or hub id where a hub is reachable). The default is built if missing.
    ``agentrl doctor --model DIR`` checks a directory before a run (``agentrl train`` runs the same checks)."""
    tool_parser: str = "hermes"
    """How the model writes tool calls: the name of one of vLLM's tool parsers (the names of ``vllm serve
    --tool-call-parser``: ``hermes``, ``llama3_json``, ``mistral``, ``qwen3_coder``, ``pythonic``, ...). The
    decoded text of each sampled turn is parsed with it; see docs/models.md for the parser of each family."""
    chat_template: str | None = None
    """The chat template to render turns with instead of the model's own: a built-in name (``hermes``: ChatML
    with the tools in the system turn and ``<tool_call>`` JSON calls) or a Jinja file. For models whose own
    template renders no tools (``agentrl doctor`` says so and names the built-in that fits). The run's saved
    model or adapter carries it (see ``agentrl.rollout.templates``). None: the model's own."""
    mode: Literal["sync", "async"] | None = None
    """``sync``: generate a batch, train, then sync (η = 0). ``async``: generation and training overlap,
    with rollouts at most ``pipeline.max_staleness`` (η ≥ 1, default 2) versions behind. Default: async when
    ``pipeline.max_staleness`` ≥ 1 is set, else sync. A mode that contradicts η is an error."""
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    """Staleness bound, drop policy, buffer capacity, update mode and weight-sync method."""
    steps: int = Field(80, ge=1)
    """Number of optimizer steps."""
    tasks_per_step: int = Field(16, ge=1)
    """Tasks (GRPO groups) per step."""
    group_size: int = Field(8, ge=1)
    """Rollouts per task (G); advantages are normalised within each group."""
    skip_uniform_groups: bool = False
    """Dynamic sampling (DAPO's): a finished group whose rewards are all equal (every episode failed, or every
    one succeeded) gives GRPO no advantage and so no gradient; it is left out of the batch and its slot goes to
    a new group, so a step trains on ``tasks_per_step`` groups that carry signal. Generation per step grows by
    1 / (1 - the share of uniform groups); the skipped groups are counted (``skipped_groups``)."""
    max_skips_per_step: float = Field(2.0, ge=0.0)
    """With ``skip_uniform_groups``: at most this many times ``tasks_per_step`` groups are skipped in one
    step; past it, uniform groups are kept (they give no gradient), so a policy whose every group is uniform
    cannot stall a step."""
    max_concurrency: int = Field(128, ge=1)
    """Episodes in flight at once, across all groups."""
    seed: int = 0
    """The run's seed (``--seed``): task sampling and rollout-table picks, and the trainer's seed (LoRA
    initialisation, its RNGs) unless ``trainer.seed`` is set itself. The engine's sampling is not seeded by it."""
    time_limit_min: float | None = Field(None, gt=0)
    """Training time limit in minutes: the training loop's wall time, without start-up and evaluations. A step
    starts only if it is expected to end inside it (the longest of the last three steps is the estimate). It is
    counted from each start: a resumed run has the whole limit again."""
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
    the engine's slow first batch (lazy kernel set-up) is not part of the first evaluation's figures
    (see ``agentrl.inference.warmup``)."""
    keep_failed: bool = False
    """Train on failed episodes (env/inference errors) too. Default: they are logged but not trained on."""
    nproc: int = Field(1, ge=1)
    """Trainer processes (torchrun --nproc_per_node)."""
    endpoints: list[str] = Field(default_factory=list)
    """Existing inference servers to use; empty: start local vLLM server(s) (one, or one per
    ``inference.tensor_parallel_size`` GPUs of ``placement.inference_gpus``)."""
    adapter_name: str = "policy"
    """Name of the LoRA adapter slot in the engine. Full-weight runs (``trainer.lora = false``) sample from
    the base model's name instead (``inference.served_model_name``; see ``policy_model``)."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """Rollout sampling."""
    trainer: TrainerSettings = Field(default_factory=TrainerSettings)
    """Trainer (FSDP2, LoRA, loss)."""
    inference: VLLMServerSettings = Field(default_factory=VLLMServerSettings)
    """The local vLLM server(s), when ``endpoints`` is empty."""
    engine_health: EngineHealthConfig = Field(default_factory=EngineHealthConfig)
    """Health checks of the engines, and how long the run waits when every engine is lost."""
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    """Which GPUs the local vLLM servers and the trainer get (``agentrl train --dry-run`` shows the plan)."""
    agent: AgentConfig = Field(default_factory=AgentConfig)
    """Black-box training: an agent program to launch per episode through the policy endpoint (empty
    command: agentrl's own agent loop runs the environment's tools)."""
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    """Experiment trackers (``--report-to``) and rollout tables, besides ``metrics.jsonl``."""

    @model_validator(mode="before")
    @classmethod
    def _one_model_path(cls, data: Any) -> Any:
        """The run has one model path, ``model``. Configs saved before it was the only one also carry
        ``trainer.model_path`` and ``inference.model``: the same path is accepted (and dropped), another one is
        an error, since the trainer and the engines must serve the same model."""
        if not isinstance(data, dict):
            return data
        model = data.get("model", DEFAULT_MODEL)
        for section, key in (("trainer", "model_path"), ("inference", "model")):
            table = data.get(section)
            if isinstance(table, dict) and key in table:
                if str(table[key]) != str(model):
                    raise SettingError(f"{section}.{key} = {table[key]!r} differs from model = {model!r}: the "
                                       f"trainer and the engines serve one model; set model alone")
                data = {**data, section: {k: v for k, v in table.items() if k != key}}
        return data

    @model_validator(mode="after")
    def _resolve_mode(self) -> RunConfig:
        """One rule: sync is η = 0, async is η ≥ 1; a contradiction names the setting to change."""
        eta = self.pipeline.max_staleness
        mode = self.mode or ("async" if eta else "sync")
        if mode == "sync" and eta:
            raise SettingError(
                f"mode = 'sync' trains on-policy (max_staleness 0), but pipeline.max_staleness = {eta}: "
                "use mode = 'async' (--mode async) to train on rollouts up to that many versions old, or "
                "leave max_staleness out")
        if mode == "async" and eta == 0:
            raise SettingError(
                "mode = 'async' overlaps generation and training, which needs pipeline.max_staleness >= 1 "
                "(--max-staleness N); max_staleness 0 is mode = 'sync'")
        self.mode = mode
        self.pipeline.max_staleness = (0 if mode == "sync" else ASYNC_MAX_STALENESS) if eta is None else eta
        self.pipeline.capacity(self.tasks_per_step)  # raises when the capacity cannot hold a step
        return self

    @model_validator(mode="after")
    def _check_lora_rank(self) -> RunConfig:
        """The engines must hold the adapter the trainer makes: refused here, not at the first load."""
        if not self.serves_adapter:
            return self
        rank, slot = self.trainer.lora_rank, self.inference.max_lora_rank
        if rank > ENGINE_LORA_RANKS[-1]:
            raise SettingError(f"trainer.lora_rank = {rank}: vLLM serves LoRA adapters up to rank "
                               f"{ENGINE_LORA_RANKS[-1]}")
        if "max_lora_rank" in self.inference.model_fields_set and slot < rank:
            raise SettingError(f"trainer.lora_rank = {rank} does not fit the engines' LoRA slots "
                               f"(inference.max_lora_rank = {slot}): raise it to {engine_lora_rank(rank)}, or "
                               "leave it out to size it from the trainer's rank")
        return self

    @model_validator(mode="after")
    def _check_full_weights(self) -> RunConfig:
        """What a full-weight run (``trainer.lora = false``) cannot do yet: a KL penalty (no reference model)."""
        if not self.trainer.lora and self.trainer.loss.kl_coef > 0:
            raise SettingError(
                f"trainer.loss.kl_coef = {self.trainer.loss.kl_coef:g} needs a reference policy: with LoRA it is "
                "the base model with the adapter switched off, but full weights (trainer.lora = false) would "
                "need a second, frozen, sharded copy of the model, which agentrl does not keep yet; use LoRA "
                "or trainer.loss.kl_coef = 0")
        return self

    @model_validator(mode="after")
    def _check_transport(self) -> RunConfig:
        """A transport named explicitly that cannot serve this run is refused here, by the rule of
        :func:`agentrl.config.sync.refusal` (the facts read off the model, a MoE on the CPU build, are checked
        when the config is resolved)."""
        problem = refusal(self.pipeline.weight_sync, self._served())
        if problem and self.pipeline.weight_sync.transport != "auto":
            raise SettingError(problem)
        return self

    def served(self) -> Served:
        """What this run asks of its weight sync (:class:`~agentrl.config.sync.Served`): LoRA or full weights,
        tensors trained whole, and a MoE model on vLLM's CPU build (read off the model directory, when it
        is there, and the installed vLLM)."""
        from agentrl.config import facts

        moe_on_cpu = self.trainer.lora and facts.model_moe(self.model) is not None and facts.cpu_build()
        return self._served(moe_on_cpu)

    def _served(self, moe_on_cpu: bool = False) -> Served:
        t = self.trainer
        return Served(t.lora, t.lora_trains_whole, moe_on_cpu, output_lora=t.lora and t.lora_train_unembed)

    @property
    def policy_model(self) -> str:
        """The model name rollouts, warm-up, evaluation and black-box agents request: the LoRA adapter's
        slot (``adapter_name``), or with full weights (``trainer.lora = false``) the base model itself
        (``inference.served_model_name``), into which the trained weights are loaded."""
        return self.adapter_name if self.serves_adapter else self.inference.served_model_name

    @property
    def context_tokens(self) -> int:
        """The longest episode the run can hold: ``sampling.max_context_tokens``, capped by the engines'
        ``inference.max_model_len``."""
        return min(self.sampling.max_context_tokens, self.inference.max_model_len)

    @property
    def micro_batch_budget(self) -> int:
        """The trainer's token budget of one forward/backward: ``trainer.micro_batch_tokens`` when set, else the
        larger of its default and the run's window (:attr:`context_tokens`), so that a micro-batch holds at least
        one whole episode of a long window (SmolLM2's 8,192) without being told."""
        budget = self.trainer.micro_batch_tokens
        return budget if "micro_batch_tokens" in self.trainer.model_fields_set else max(budget, self.context_tokens)

    @property
    def serves_adapter(self) -> bool:
        """The engines serve the trained policy from a LoRA slot: the transport serves an adapter (before the
        config is resolved, ``auto`` of a LoRA run counts as one: it chooses the slots wherever they serve)."""
        return self.trainer.lora and self.pipeline.weight_sync.serves in ("adapter", None)

    @property
    def transport(self) -> TransportConfig:
        """The run's weight-sync transport (``pipeline.weight_sync``), settled once the config is resolved."""
        return self.pipeline.weight_sync

    @property
    def run_dir(self) -> Path:
        """``<output_dir>/<name>`` (before ``rundir.open_run`` settles a default name: without its suffix)."""
        return self.output_dir / (self.name or default_run_name(self.env))

    @property
    def final_policy_dir(self) -> Path:
        """Where a finished run saves its trained policy: ``<run_dir>/final_adapter`` (a peft adapter, for
        ``agentrl eval --adapter``) or, with full weights, ``<run_dir>/final_model`` (a whole Hugging Face
        model directory, for ``agentrl eval --model``)."""
        return self.run_dir / ("final_adapter" if self.trainer.lora else "final_model")

    def resolved(self) -> RunConfig:
        """The run's settings, resolved once and frozen (a frozen config is returned as it is): the weight-sync
        transport settled (``auto`` chosen, and every choice checked against the model: :func:`~agentrl.config.
        sync.settle`); the context lengths agree; a full-weight run's own engines serve no LoRA adapters unless ``inference.enable_lora``
        is set explicitly, and start vLLM's NCCL weight-transfer engine when ``pipeline.weight_sync = "nccl"``;
        a LoRA run's engines wrap only the layers its adapter trains (``inference.lora_target_modules``);
        the trainer takes the run's ``seed`` unless ``trainer.seed`` is set, its token budget holds one whole
        episode unless ``trainer.micro_batch_tokens`` is set (:attr:`micro_batch_budget`), and a learning-rate
        decay that names no end ends at the run's last optimizer step. Assigning to the result raises
        :class:`~agentrl.config.base.FrozenConfigError`; :meth:`with_changes` makes a changed one."""
        if self.is_frozen:
            return self
        cfg = self.thawed()
        if "seed" not in cfg.trainer.model_fields_set:
            cfg.trainer.seed = cfg.seed
        cfg.pipeline.weight_sync = settle(cfg.pipeline.weight_sync, cfg.served())
        if cfg.trainer.lr_decay_steps == 0:
            cfg.trainer.lr_decay_steps = cfg.steps * cfg.trainer.ppo_epochs * cfg.trainer.num_minibatches
        if "max_lora_rank" not in cfg.inference.model_fields_set:  # the slot that holds the trainer's adapter
            cfg.inference.max_lora_rank = max(cfg.inference.max_lora_rank, engine_lora_rank(cfg.trainer.lora_rank))
        if not cfg.serves_adapter and "enable_lora" not in cfg.inference.model_fields_set:
            cfg.inference.enable_lora = False
        if cfg.trainer.lora and "lora_target_modules" not in cfg.inference.model_fields_set:
            cfg.inference.lora_target_modules = cfg.trainer.lora_modules  # the layers it trains
        if cfg.pipeline.weight_sync.transport == "nccl" and cfg.inference.weight_transfer_backend is None:
            cfg.inference.weight_transfer_backend = "nccl"  # the engines' half of the NCCL transfer
        cfg.sampling.max_context_tokens = cfg.context_tokens
        if cfg.micro_batch_budget != cfg.trainer.micro_batch_tokens:  # at least one whole episode, unless set
            cfg.trainer.micro_batch_tokens = cfg.micro_batch_budget
        out = cfg.frozen()
        out.__pydantic_private__["_settings"] = self.thawed()  # type: ignore[index]  # what it resolved from
        return out

    def with_changes(self, changes: Mapping[str, Any]) -> RunConfig:
        """This config with dotted settings changed (``{"inference.enable_lora": True}``), checked like a
        config file. A resolved config changes the settings it was resolved from, then resolves again (so a
        value that resolution derived from the old settings is derived anew)."""
        source = (self.__pydantic_private__ or {}).get("_settings") if self.is_frozen else None
        data = given(source or self)
        for setting, value in changes.items():
            set_dotted(data, setting, value)
        out = validate(RunConfig, data)
        return out.resolved() if self.is_frozen else out

    def trainer_config(self) -> TrainerConfig:
        """What the trainer workers are sent: the ``[trainer]`` settings and the run's ``model``."""
        return TrainerConfig(model_path=self.model, **given(self.trainer))

    def server_config(self) -> VLLMServerConfig:
        """How to launch one of the run's own vLLM servers: the ``[inference]`` settings and the run's
        ``model``."""
        return VLLMServerConfig(model=self.model, **given(self.inference))

    def training_problems(self) -> list[str]:
        """Why this config cannot train correctly (empty: it can). Checked before a run starts."""
        out = self.sampling.training_problems()
        context = self.context_tokens
        if context > self.micro_batch_budget:
            out.append(f"sampling.max_context_tokens = {context} is more than trainer.micro_batch_tokens = "
                       f"{self.trainer.micro_batch_tokens}: an episode of that length would not fit one "
                       "forward/backward's token budget; lower the context or raise the budget")
        if self.sampling.truncates:
            out += self._truncation_problems()
        if self.endpoints == [] and self.inference.logprobs_mode != "processed_logprobs" and (
                self.sampling.temperature != 1.0):
            out.append(f"inference.logprobs_mode = {self.inference.logprobs_mode!r} reports logprobs at "
                       f"temperature 1 while rollouts sample at {self.sampling.temperature}; use "
                       "'processed_logprobs'")
        return out

    def _truncation_problems(self) -> list[str]:
        """Why a run with truncated sampling cannot record and replay its sampling masks (empty: it can)."""
        what = (f"sampling top_p = {self.sampling.top_p}, top_k = {self.sampling.top_k}, min_p = "
                f"{self.sampling.min_p}")
        if self.inference.logprobs_mode != "processed_logprobs":
            return [f"{what} needs inference.logprobs_mode = 'processed_logprobs': the engine records each kept "
                    "set from the processed distribution"]
        return []

    def check_trainable(self) -> None:
        """Raise :class:`~agentrl.config.errors.SettingError` (a ``ValueError``) listing
        :meth:`training_problems`, if any."""
        problems = self.training_problems()
        if problems:
            raise SettingError("this configuration cannot train correctly:\n  " + "\n  ".join(problems))

    def to_toml(self) -> str:
        """The fully resolved config as TOML (what ``agentrl train --print-config`` prints)."""
        return to_toml(self.model_dump(mode="json", exclude_none=True))


class TomlValueError(ConfigError, TypeError):
    """A config value has a type TOML cannot write (``to_toml`` writes scalars, lists and tables)."""

    code = "config.toml_value"


class ConfigFileNotFound(ConfigError, FileNotFoundError):
    """The TOML config file given (a run's or an env server's) does not exist."""

    code = "config.file_not_found"


def _toml_value(v: Any) -> str:
    import json

    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TomlValueError(f"cannot write {type(v).__name__} as TOML")


def to_toml(data: dict[str, Any], prefix: str = "") -> str:
    """``data`` (JSON-like: scalars, lists and nested tables) as TOML text; tables after scalars."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for k, v in data.items():
        if isinstance(v, dict):
            lines += ["", f"[{prefix}{k}]", to_toml(v, prefix=f"{prefix}{k}.")]
    return "\n".join(lines).strip("\n")


def default_run_name(env: str) -> str:
    """The run name used when none is given: the environment's registered name, else its class name in
    lower case (``my_env.py:Weather`` -> ``weather``); ``openenv`` for an OpenEnv server (``openenv:<url>``)."""
    if env.startswith("openenv:"):
        return "openenv"
    return env.rpartition(":")[2].lower() if ":" in env else env


def read_toml(path: Path) -> dict[str, Any]:
    """A TOML config file's contents; :class:`ConfigFileNotFound` (a ``FileNotFoundError``) when it is missing,
    ``ConfigValidationError`` naming the file and line when it is not TOML."""
    path = Path(path)
    if not path.is_file():
        raise ConfigFileNotFound(f"config file {path} does not exist")
    with path.open("rb") as f:
        try:
            return tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ConfigValidationError([f"{path} is not valid TOML: {e}"]) from None


def _is_moe(model: str) -> bool:
    """Whether the local model directory ``model`` is a mixture of experts (False where it cannot say)."""
    from agentrl.config import facts

    try:
        return facts.model_moe(model) is not None
    except ValueError:  # a family agentrl cannot replay: the run's own checks name it
        return False


def load_config(path: Path | None = None, overrides: dict[str, Any] | None = None,
                flags: Mapping[str, str] | None = None, beneath: dict[str, Any] | None = None) -> RunConfig:
    """Defaults, then the environment's preset, then ``beneath`` (what a saved policy describes:
    ``agentrl.launch.described``), then the TOML file, then ``overrides`` (nested dicts; ``None`` values are
    ignored).

    A full-weight run (``trainer.lora = false``) that sets no ``trainer.lr`` gets a full-weight learning rate
    from the preset layer instead of the LoRA one (see :func:`~agentrl.config.presets.preset_for`).

    The window (``inference.max_model_len``, ``sampling.max_context_tokens``) of a model directory that is not
    the embedded tiny model is its own (``max_position_embeddings``), not the preset's, unless the file, the
    flags or ``beneath`` give one; one window setting given sizes both, in a layer over ``beneath``'s when the
    file or the flags give it (:func:`~agentrl.config.window.model_window`). A window setting in the file or
    the flags beyond the model's raises
    :class:`~agentrl.config.window.WindowTooLong`, naming the file's setting or the flag.

    An invalid or unknown setting raises :class:`~agentrl.config.errors.ConfigValidationError` (a
    ``ValueError``), one line per problem naming the setting, the value and where to fix it (``flags``: the
    command-line flag of each dotted setting, for those messages)."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        data = read_toml(path)
    clean = {k: v for k, v in (overrides or {}).items() if v is not None}
    described = deep_update(beneath or {}, data)
    env = clean.get("env", described.get("env", "calc"))
    given = deep_update(described, clean)
    trainer = given.get("trainer")
    full_weights = isinstance(trainer, dict) and trainer.get("lora") is False
    model = str(given.get("model", DEFAULT_MODEL))
    embedded = is_embedded_model(model) or model == DEFAULT_MODEL
    check_window(model, given_windows(data), file=path)
    check_window(model, given_windows(clean), names=flags)
    windows = {**given_windows(data), **given_windows(clean)} or given_windows(beneath)
    window = model_window(model, windows) if windows or not embedded else {}  # the embedded model: its preset's
    preset = yielding(preset_for(env, full_weights=full_weights, embedded=embedded), given, moe=_is_moe(model))
    merged = deep_update(preset, beneath or {})
    merged = deep_update(deep_update(deep_update(merged, window), data), clean)
    return validate(RunConfig, merged, file=path, file_data=data, overrides=clean, flags=flags)
