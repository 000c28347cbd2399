"""The errors the trainer's worker side raises in several of its modules (the client's own is
:class:`agentrl.trainer.client.TrainerError`, which carries them back from the worker as its message).

This module imports only :mod:`agentrl.core.errors`: every trainer module may import it."""

from __future__ import annotations

from agentrl.core.errors import AgentRLError, ConfigError

__all__ = ["BatchError", "TrainerSettingError"]


class TrainerSettingError(ConfigError, ValueError):
    """A trainer setting cannot be used with this model or with another setting (the message names it)."""

    code = "config.trainer_setting"


class BatchError(AgentRLError, ValueError):
    """A training batch, or the token budget or rank count it is split by, cannot be used (no samples, no loss
    tokens, routing of mixed shapes, a packed row of several samples, a budget that is not positive)."""

    code = "trainer.batch"
