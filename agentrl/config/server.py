"""Configuration of the hosted environment server (``agentrl serve-env``), one docstring per field."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from agentrl.config.base import Section
from agentrl.config.errors import SettingError, validate

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or name to bind) only accepts connections from this machine."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ServerConfig(Section):
    """What the server serves, who may use it, and the limits it enforces."""

    envs: list[str] = Field(default_factory=lambda: ["calc"], min_length=1)
    """Environments to serve: registered names (``calc``) or ``package.module:Class`` paths."""
    host: str = "127.0.0.1"
    """Address to bind. Anything but loopback needs a token."""
    port: int = Field(8765, ge=0, le=65535)
    """TCP port (0: any free port; the chosen one is printed)."""
    token: str | None = Field(None, min_length=16, repr=False)
    """Bearer token clients must send (``Authorization: Bearer <token>``). None with ``auth`` on: one is
    generated at start and printed."""
    auth: bool = True
    """Require the bearer token. Turning it off is only allowed on a loopback ``host``."""
    max_sessions: int = Field(256, ge=1, le=100_000)
    """Open sessions at most, over all clients; more answer HTTP 429."""
    max_sessions_per_client: int = Field(128, ge=1, le=100_000)
    """Open sessions at most per client address; more answer HTTP 429."""
    session_ttl_s: float = Field(600.0, gt=0, le=7 * 86400)
    """A session with no request for this long is closed and its resources released."""
    max_session_age_s: float = Field(4 * 3600.0, gt=0, le=30 * 86400)
    """A session older than this is closed, however active."""
    step_timeout_s: float = Field(60.0, gt=0, le=3600)
    """Wall-clock limit of one step (all its tool calls); calls past it answer a timeout observation."""
    reset_timeout_s: float = Field(120.0, gt=0, le=3600)
    """Wall-clock limit of an environment's ``reset`` when a session is created."""
    reward_timeout_s: float = Field(120.0, gt=0, le=3600)
    """Wall-clock limit of an environment's ``reward``."""
    close_timeout_s: float = Field(30.0, gt=0, le=600)
    """Wall-clock limit of an environment's ``close``."""
    max_tool_calls_per_step: int = Field(16, ge=1, le=1024)
    """Tool calls one step may carry; more answer HTTP 422."""
    max_steps_per_session: int = Field(1024, ge=1, le=1_000_000)
    """Steps one session may take (a bound even for clients that enforce turn limits themselves)."""
    max_request_bytes: int = Field(4 << 20, ge=1024, le=1 << 30)
    """Largest request body accepted, bytes; larger answer HTTP 413 (a reward request carries the whole
    conversation, tool outputs included)."""
    idempotency_cache: int = Field(64, ge=1, le=100_000)
    """Step results remembered per session, by ``Idempotency-Key``, so retries never run a tool twice."""
    allow_task_payload: bool = True
    """Accept sessions on caller-supplied task objects, not only on task ids of the environment's dataset."""
    tokenizers: list[str] = Field(default_factory=list)
    """Tokenizers (model directories or hub ids) whose chat templates ``POST /v1/rollouts`` may use; the
    first is the default. Empty: whole rollouts are not served."""
    chat_template: str | None = None
    """The chat template ``POST /v1/rollouts`` renders with instead of each tokenizer's own: a built-in name
    (``hermes``) or a Jinja file (see ``agentrl.rollout.templates``). None: each tokenizer's own."""
    max_rollouts: int = Field(32, ge=1, le=10_000)
    """Whole rollouts running at once; more answer HTTP 429."""
    inference_timeout_s: float = Field(120.0, gt=0, le=3600)
    """Timeout of each request to a caller's inference server during a rollout."""
    owner: str = ""
    """Run id on the labels of sandbox containers the environments start ("": a new id per server
    process), so that a later start can remove what a crashed server left behind."""
    sandbox_gc: bool = True
    """At start, remove sandbox containers of dead drivers (a previous server killed with ``kill -9``);
    at shutdown, remove any container still labelled with this server's ``owner``."""
    reap_interval_s: float = Field(5.0, gt=0, le=3600)
    """How often the reaper looks for expired sessions."""
    access_log: bool = False
    """Log every request (uvicorn's access log)."""

    @model_validator(mode="after")
    def _check_auth(self) -> ServerConfig:
        if not self.auth and not is_loopback(self.host):
            raise SettingError(
                f"refusing to serve without authentication on {self.host!r}: --no-auth is only allowed on a "
                "loopback address (127.0.0.1, ::1, localhost)"
            )
        if self.max_sessions_per_client > self.max_sessions:
            self.max_sessions_per_client = self.max_sessions
        return self


def load_server_config(path: Path | None = None, overrides: dict[str, Any] | None = None,
                       flags: Mapping[str, str] | None = None, beneath: dict[str, Any] | None = None) -> ServerConfig:
    """Defaults < ``beneath`` (what a saved policy describes: its tokenizer and chat template) < TOML file
    (``[server]`` table or top level) < ``overrides`` (``None`` values ignored).

    An invalid or unknown setting raises :class:`~agentrl.config.errors.ConfigValidationError`, one line per
    problem; a token's value is never echoed."""
    from agentrl.config.run import read_toml

    raw: dict[str, Any] = {}
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        raw = read_toml(path)
        data = dict(raw.get("server", raw))
    table = ("server",) if "server" in raw else ()
    clean = {k: v for k, v in (overrides or {}).items() if v is not None}
    described = {k: v for k, v in (beneath or {}).items() if v is not None}
    return validate(ServerConfig, {**described, **data, **clean}, file=path, file_data=data, overrides=clean, flags=flags,
                    prefix=table)
