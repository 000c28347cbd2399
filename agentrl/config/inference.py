"""How to launch one vLLM server (pure pydantic: imported by the run config without starting anything)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from agentrl.config.base import Section
from agentrl.config.errors import SettingError

ENGINE_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The LoRA slot ranks vLLM accepts (``vllm.config.lora.MaxLoRARanks``; a contract test compares them)."""


def engine_lora_rank(rank: int) -> int:
    """The smallest engine slot rank that holds a rank-``rank`` adapter (``rank`` itself above the largest)."""
    return next((r for r in ENGINE_LORA_RANKS if r >= rank), rank)


class VLLMServerSettings(Section):
    """How to launch one vLLM server, but for the model it serves: a run's ``[inference]`` section (the run
    has one model path, its ``model``; :meth:`agentrl.config.run.RunConfig.server_config` adds it)."""

    served_model_name: str = "base"
    """Name of the base model in the OpenAI API (LoRA adapters are addressed by their own names)."""
    host: str = "127.0.0.1"
    """Interface to bind."""
    port: int = Field(0, ge=0, le=65535)
    """TCP port; 0 picks a free one."""
    dtype: str = "auto"
    """Weights/activations dtype passed to vLLM (auto, float32, bfloat16, float16)."""
    max_model_len: int = Field(2048, ge=16)
    """Longest prompt + completion, in tokens."""
    enable_lora: bool = True
    """Serve LoRA adapters (needed for the RL weight sync)."""
    max_lora_rank: int = Field(16, ge=1, le=512)
    """Largest LoRA rank the engine reserves room for: one of vLLM's slot sizes (``ENGINE_LORA_RANKS``). A run
    sets it from ``trainer.lora_rank`` (the smallest slot that holds the adapter) unless it is set here."""

    @field_validator("max_lora_rank")
    @classmethod
    def _a_slot_size(cls, rank: int) -> int:
        if rank not in ENGINE_LORA_RANKS:
            raise SettingError(f"inference.max_lora_rank = {rank}: vLLM reserves LoRA slots of rank "
                               f"{', '.join(map(str, ENGINE_LORA_RANKS))} only; use the smallest that holds the "
                               f"adapter ({engine_lora_rank(rank)})")
        return rank
    max_loras: int = Field(2, ge=1, le=64)
    """LoRA adapters resident in one batch."""
    lora_target_modules: list[str] | None = None
    """The layers the engine wraps for LoRA (vLLM's ``--lora-target-modules``, names as the trainer's
    ``lora_target_modules``); a served adapter's weights on other layers are not applied. None: every layer
    vLLM can wrap, the token embedding and the output layer included. A run sets it to the trainer's
    (``trainer.lora_target_modules``, and ``lm_head`` with ``trainer.lora_train_unembed``) unless it is set
    here: its engines hold slots for what its trainer trains and nothing else (no generation speed was measured to change: docs/async.md)."""
    gpu_memory_utilization: float = Field(0.85, gt=0.0, le=1.0)
    """Fraction of GPU memory vLLM may use (GPU builds only; ignored on CPU)."""
    cpu_kvcache_gb: int | None = Field(None, ge=1, le=1024)
    """KV-cache size in GiB on the CPU build (VLLM_CPU_KVCACHE_SPACE). None: sized from the model, room for
    ``KV_SEQUENCES`` (128) sequences of ``max_model_len`` tokens, at least 1 GiB and at most a quarter of the
    machine's memory (see ``agentrl.inference.server.kv_cache_gib``). A cache too small for the episodes in
    flight makes the engine preempt and recompute them: a real 135M model in a 1 GiB cache generated a tenth
    of its speed."""
    cpu_cores: str | None = Field(None, pattern=r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$")
    """CPU only: run the server on these cores (a ``taskset`` list such as ``"0"`` or ``"0-3"``) and bind
    its OpenMP threads there, so inference and a trainer pinned elsewhere do not compete for cores."""
    tensor_parallel_size: int = Field(1, ge=1, le=64)
    """GPUs per engine (tensor parallelism)."""
    seed: int = 0
    """Engine seed."""
    startup_timeout_s: float = Field(300.0, gt=0.0)
    """Seconds to wait for ``GET /health`` to succeed."""
    extra_args: list[str] = Field(default_factory=list)
    """Extra command-line arguments appended verbatim."""
    enable_prefix_caching: bool = True
    """Reuse the KV cache of shared prompt prefixes (multi-turn episodes re-send their history)."""
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = "processed_logprobs"
    """Which logprobs the engine reports (``--logprobs-mode``). ``processed_logprobs``: of the distribution
    the token was sampled from (after temperature), which the trainer reproduces; ``raw_logprobs`` (vLLM's
    default): of the model at temperature 1, wrong for training at any other temperature."""
    weight_transfer_backend: str | None = None
    """vLLM's weight-transfer engine (``--weight-transfer-config``), e.g. ``nccl``: set by a run with
    ``pipeline.weight_sync = "nccl"`` (full weights over NCCL, GPUs only); None starts none."""
    worker_extension: str | None = "agentrl.engine.extension.WorkerExtension"
    """Worker extension class (``--worker-extension-cls``) for in-place LoRA sync over shared memory;
    None disables it. Left out (with a warning) when it cannot be imported, so the server still starts."""

    @field_validator("worker_extension")
    @classmethod
    def _not_the_old_name(cls, name: str | None) -> str | None:
        if name is not None and name.startswith("agentrl.inference.lora_ext."):
            raise SettingError(f"inference.worker_extension = {name!r} is the extension's old name, which is gone: "
                               "use agentrl.engine.extension.WorkerExtension (the default)")
        return name


class VLLMServerConfig(VLLMServerSettings):
    """How to launch one vLLM server: the settings and the model it serves."""

    model: str
    """Local model directory (config.json + weights + tokenizer)."""


class EngineHealthConfig(Section):
    """How a run watches its inference engines (``agentrl.inference.watch``): when one leaves the rotation,
    and how long the run waits for one to come back when none is left."""

    interval_s: float = Field(5.0, gt=0.0)
    """Seconds between two health checks (``GET /health``) of the engines."""
    timeout_s: float = Field(10.0, gt=0.0)
    """A health check that has no answer within this time fails."""
    failures_to_drop: int = Field(3, ge=1)
    """Consecutive failed health checks before an engine leaves the rotation (a busy CPU engine can miss
    one). A refused connection takes it out at once."""
    request_timeout_s: float = Field(600.0, gt=0.0)
    """A request to an engine (a generation, a weight update) with no answer within this time fails and is
    retried, on another engine when there is one. Time queued inside the engine counts: on a CPU, 128 long
    generations in flight on a 135M model took minutes each, past the former fixed 120 s."""
    lost_after_s: float = Field(60.0, gt=0.0)
    """With no engine in rotation for this long, the run stops after saving a checkpoint (exit code 2;
    continue with ``--resume`` once engines are back). An engine that answers again before then rejoins at
    the current policy version and the run goes on."""
