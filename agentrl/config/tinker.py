"""Settings of the Tinker API server (``agentrl serve-tinker``), one docstring per field. Only pydantic here."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from agentrl.config.base import Section
from agentrl.config.errors import validate


class TinkerConfig(Section):
    """One base model, one trainer, one sampling engine, served over the tinker SDK's wire protocol."""

    model: str = "models/tiny"
    """The base model's directory (config.json, weights, tokenizer)."""
    model_name: str | None = None
    """The name clients ask for (``base_model``); default: the model directory's name."""
    host: str = "127.0.0.1"
    """Address to bind (a non-loopback address needs API keys)."""
    port: int = Field(8790, ge=0, le=65535)
    """TCP port (0: any free port; the chosen one is printed)."""
    max_adapters: int = Field(4, ge=1, le=64)
    """LoRA adapters resident in the sampling engine's slots at once (more are loaded again on demand)."""
    max_rank: int = Field(32, ge=1, le=512)
    """The largest LoRA rank a training client may ask for (the SDK's default is 32)."""
    api_keys: str | None = None
    """A file of API keys, one a line (the SDK's ``tml-...`` form); unset: AGENTRL_TINKER_API_KEYS
    (comma-separated), else any ``tml-`` key is its own tenant (loopback only)."""
    dir: str = "runs/serve-tinker"
    """The server's state directory: checkpoints (``tinker://`` paths) and the engine's logs; a restart on the
    same directory loads the checkpoints saved before."""
    max_model_len: int | None = Field(None, ge=16)
    """Prompt plus completion tokens at most; unset: the model's ``max_position_embeddings``, at most 4096."""
    session_ttl_s: float = Field(600.0, ge=30)
    """A session without a heartbeat for this long is finished and its adapters freed (the SDK beats every
    10 s while its client lives)."""
    seq_gap_timeout_s: float = Field(120.0, gt=0)
    """A model's request waits this long for a missing lower ``seq_id`` before it fails."""

    @property
    def served_name(self) -> str:
        return self.model_name or Path(self.model).resolve().name


def load_tinker_config(overrides: Mapping[str, Any] | None = None,
                       flags: Mapping[str, str] | None = None) -> TinkerConfig:
    """Defaults < ``overrides`` (``None`` values ignored); an invalid setting raises a config error naming
    the flag."""
    clean = {k: v for k, v in (overrides or {}).items() if v is not None}
    return validate(TinkerConfig, clean, overrides=clean, flags=flags)
