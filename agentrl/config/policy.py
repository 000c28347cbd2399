"""Settings of the policy endpoint (``agentrl serve-policy``) and of black-box training runs, one docstring
per field. Only pydantic here: every part of agentrl may import it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from agentrl.config.base import Section
from agentrl.config.errors import validate

DEFAULT_CONTEXT_TOKENS = 2048
"""The endpoint's window when neither its settings nor its model give one."""


class PolicyConfig(Section):
    """The chat endpoint and its episodes."""

    host: str = "127.0.0.1"
    """Address to bind."""
    port: int = Field(8780, ge=0, le=65535)
    """TCP port (0: any free port; the chosen one is printed)."""
    token: str | None = Field(None, min_length=16, repr=False)
    """The server's bearer token: needed to create episodes (default: generated and printed)."""
    served_model: str = "agentrl-policy"
    """The model name ``GET /v1/models`` lists; requests may name any model (the policy is the policy)."""
    episode_ttl_s: float = Field(600.0, gt=0, le=7 * 86400)
    """An episode with no call and no reward for this long is closed and recorded as failed."""
    max_open_episodes: int = Field(4096, ge=1, le=1_000_000)
    """Open episodes at most; more answer HTTP 429."""
    max_kept_episodes: int = Field(10_000, ge=1, le=1_000_000)
    """Finished episodes whose trajectories stay readable (the oldest are forgotten first)."""
    max_tokens_per_call: int = Field(1024, ge=1)
    """Most tokens one call may generate (a request's ``max_tokens`` is capped by it)."""
    max_context_tokens: int | None = Field(None, ge=16)
    """Prompt plus completion tokens at most; a longer prompt answers HTTP 400 ``context_length_exceeded``. Unset:
    the served model's window (what a saved policy was trained with, else ``max_position_embeddings`` in the
    model directory's config.json), else 2048."""
    max_request_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    """Largest request body accepted (HTTP 413 above)."""
    temperature: float | None = Field(None, ge=0.0)
    """Sample at this temperature whatever the request says (training sets the run's); None: the request's
    (default 1)."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """With ``temperature`` pinned (training): the nucleus mass every call samples with, whatever the request
    says; else the request's applies."""
    top_k: int = Field(0, ge=0)
    """With ``temperature`` pinned: the top-k every call samples with (0: none)."""
    min_p: float = Field(0.0, ge=0.0, lt=1.0)
    """With ``temperature`` pinned: the min-p every call samples with (0: none)."""
    sampling_masks: bool = False
    """Record the engine's kept set of every sampled token in the rows where sampling truncates (training
    sets it when the run truncates; the engines' capture must be on)."""
    max_stored_responses: int = Field(10_000, ge=1, le=10_000_000)
    """Responses API answers kept for ``previous_response_id`` (the oldest are forgotten first; a chain costs
    each answer's own messages once)."""
    generate_timeout_s: float = Field(600.0, gt=0)
    """Wall-clock limit of one call's generation (queueing and weight-update pauses included)."""

    @property
    def context_tokens(self) -> int:
        """The window the endpoint enforces: ``max_context_tokens``, or ``DEFAULT_CONTEXT_TOKENS`` when unset."""
        return self.max_context_tokens if self.max_context_tokens is not None else DEFAULT_CONTEXT_TOKENS


def load_policy_config(overrides: Mapping[str, Any] | None = None,
                       flags: Mapping[str, str] | None = None) -> PolicyConfig:
    """Defaults < ``overrides`` (``None`` values ignored); an invalid setting raises
    :class:`~agentrl.config.errors.ConfigValidationError`, one line per problem naming the flag to fix."""
    clean = {k: v for k, v in (overrides or {}).items() if v is not None}
    return validate(PolicyConfig, clean, overrides=clean, flags=flags)


class AgentConfig(Section):
    """Black-box training: the agent program agentrl launches, once per episode."""

    command: list[str] = Field(default_factory=list)
    """The agent program's command line (empty: the run trains its environment with agentrl's own loop).
    It gets ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``AGENTRL_TASK`` (JSON) in its environment and the
    same task JSON on stdin."""
    reward: Literal["env", "agent"] = "env"
    """Who scores an episode: ``env`` (the environment's ``reward`` on the episode's last transcript) or
    ``agent`` (the program posts ``{"reward": r}`` to its episode; an episode without one is failed)."""
    timeout_s: float = Field(300.0, gt=0)
    """Wall-clock limit of one agent program; past it the program's process group is killed and the
    episode recorded as failed."""
    max_running: int = Field(32, ge=1)
    """Agent programs running at once."""
    memory_mb: int | None = Field(None, ge=16)
    """Address-space limit of one agent program, in MiB (``RLIMIT_AS``, inherited by what it starts): past it
    allocations fail, the program typically exits with a ``MemoryError``, and the episode is recorded as
    failed. None: no limit. With ``image``: the container's memory limit (default 1024)."""
    image: str | None = None
    """Run each agent program in a fresh container of this image (on the run's Docker engine, which must run
    on this host) instead of on the host: no network but a loopback interface, on which the policy endpoint
    is forwarded (``OPENAI_BASE_URL`` points there), a read-only root, no capabilities, a non-root user
    (uid 1000), a writable ``/workspace`` and ``/tmp``. ``command`` runs inside it and must be in the
    image, as must ``python3`` (the forwarder runs on it). The task is in ``AGENTRL_TASK`` only (not on
    stdin). None: programs run on the host."""
