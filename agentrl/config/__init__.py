"""Configuration: pure pydantic models, one docstring per field, loadable from TOML. Nothing here imports
torch, vLLM or an HTTP stack, so every other package may import it.

- :mod:`agentrl.config.run`: `RunConfig` (a training or evaluation run) and its sections;
- :mod:`agentrl.config.trainer`, :mod:`agentrl.config.inference`, :mod:`agentrl.config.placement`: the
  trainer, vLLM servers and device placement sections;
- :mod:`agentrl.config.policy`, :mod:`agentrl.config.server`: the policy endpoint and the environment server;
- :mod:`agentrl.config.presets`: per-environment experiment presets.
"""

from __future__ import annotations

from typing import Any

_RUN = ("RunConfig", "SamplingConfig", "PipelineConfig", "load_config", "to_toml", "default_run_name",
        "DEFAULT_MODEL")
__all__ = list(_RUN)


def __getattr__(name: str) -> Any:
    """``from agentrl.config import RunConfig`` as before the package split (lazily: no cycles)."""
    if name in _RUN:
        from agentrl.config import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
