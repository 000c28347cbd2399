"""`RemoteEnvironment`: an environment served by ``agentrl serve-env`` elsewhere, as a drop-in `Environment`.

::

    RemoteCalc = agentrl.RemoteEnvironment.bind("http://10.0.0.7:8765", token, env="calc")
    traj = await agentrl.run_episode(RemoteCalc, RemoteCalc.tasks("test")[0], client, chat, sampling)

``bind`` fetches the environment's description once (tools, limits) and returns a subclass whose
instances each hold one server session: ``reset`` opens it, ``call_tool`` is one step, ``reward`` scores the
client's own transcript, ``close`` deletes it. ``agentrl train --env calc --env-url URL`` does this.

Every request has a timeout and bounded retries (connection errors, timeouts, 429/502/503/504, honouring
``Retry-After``). Steps and session creation carry an ``Idempotency-Key``, so a retry after a lost answer
returns the first result: a tool never runs twice.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import uuid
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import httpx

from agentrl.core.errors import ConfigError, EnvError
from agentrl.core.types import Message
from agentrl.core.utils.retry import RetriesExhausted, Retry, RetryPolicy
from agentrl.core.utils.tls import tls_context
from agentrl.environment.base import (
    AgentTimeLimit,
    Environment,
    EnvStateError,
    NoTasksError,
    Task,
    ToolArgumentError,
    ToolError,
    ToolTimeoutError,
)

log = logging.getLogger(__name__)

TOKEN_ENV = "AGENTRL_ENV_TOKEN"
"""Environment variable read for the token when none is given."""
RETRY_STATUS = frozenset({429, 502, 503, 504})
"""HTTP statuses worth retrying (the server is busy or restarting)."""


class RemoteEnvError(EnvError, RuntimeError):
    """The environment server was unreachable, refused a request, or reported an environment failure.
    ``code``: the server's error code (the ``error`` field of its answer) when it sent one, else this class's."""

    code = "env.remote"

    def __init__(self, message: str, *, status_code: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code or type(self).code


class MissingServerUrl(ConfigError, ValueError):
    """A ``RemoteEnvironment`` was created without the env server's URL (and its class is not bound to one)."""

    code = "config.env_server_url"


def _error_of(r: httpx.Response) -> tuple[str, str | None]:
    """(message, code) of an error answer."""
    try:
        body = r.json()
    except ValueError:
        return r.text[:300] or r.reason_phrase, None
    if isinstance(body, dict) and "message" in body:
        return str(body["message"]), body.get("error")
    return str(body)[:300], None


def _retry_after(r: httpx.Response) -> float | None:
    try:
        return float(r.headers.get("retry-after", ""))
    except ValueError:
        return None


class _Retrying:
    """The retry policy of the sync and async request paths (see ``agentrl.core.utils.retry``)."""

    def __init__(
        self, url: str, token: str | None, timeout_s: float, max_retries: int, backoff_s: float
    ) -> None:
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))
        self.policy = RetryPolicy(max_retries=max_retries, backoff_s=backoff_s, max_backoff_s=10.0)

    def outcome(self, method: str, path: str, r: httpx.Response, ok_status: Sequence[int]) -> Any:
        """The JSON body of a success, None for an accepted status; ``Retry`` for a busy server, else raise."""
        if r.status_code in RETRY_STATUS:
            raise Retry(f"HTTP {r.status_code}: {_error_of(r)[0]}", retry_after_s=_retry_after(r))
        if r.status_code < 300:
            return r.json() if r.content else None
        if r.status_code in ok_status:
            return None
        msg, code = _error_of(r)
        raise RemoteEnvError(
            f"{method} {self.url}{path} answered HTTP {r.status_code}: {msg}",
            status_code=r.status_code,
            code=code,
        )

    def give_up(self, method: str, path: str, e: RetriesExhausted) -> RemoteEnvError:
        return RemoteEnvError(
            f"env server {self.url} failed {method} {path} after {len(e.errors)} "
            f"attempts (is it running and reachable?); last error: {e}"
        )

    def request_sync(self, method: str, path: str, *, params: dict[str, Any] | None = None) -> Any:
        with httpx.Client(timeout=self.timeout, headers=self.headers, verify=tls_context()) as http:

            def attempt(_: int) -> Any:
                try:
                    resp = http.request(method, self.url + path, params=params)
                except httpx.TransportError as e:
                    raise Retry(f"{type(e).__name__}: {e}") from None
                return self.outcome(method, path, resp, ())

            try:
                return self.policy.run_sync(attempt)
            except RetriesExhausted as e:
                raise self.give_up(method, path, e) from None

    async def request(
        self,
        http: httpx.AsyncClient,
        method: str,
        path: str,
        *,
        json: Any = None,
        key: str | None = None,
        ok_status: Sequence[int] = (),
        retries: int | None = None,
    ) -> Any:
        headers = {"Idempotency-Key": key} if key else None
        policy = self.policy if retries is None else dataclasses.replace(self.policy, max_retries=retries)

        async def attempt(_: int) -> Any:
            try:
                resp = await http.request(method, self.url + path, json=json, headers=headers)
            except httpx.TransportError as e:
                raise Retry(f"{type(e).__name__}: {e}") from None
            return self.outcome(method, path, resp, ok_status)

        try:
            return await policy.run(attempt)
        except RetriesExhausted as e:
            raise self.give_up(method, path, e) from None


class _either:
    """A method callable on the class (bound class attributes) or an instance (per-session values)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    def __get__(self, obj: Any, cls: type) -> Callable[..., Any]:
        return functools.partial(self.fn, obj if obj is not None else cls)


class RemoteEnvironment(Environment):
    """An environment on an ``agentrl serve-env`` server (see the module docstring).

    ``RemoteEnvironment(url, token, env="calc")`` is one episode's client; ``RemoteEnvironment.bind(...)``
    returns a class to hand to the agent loop (which creates one instance per episode)."""

    url: ClassVar[str] = ""
    """Base URL of the server."""
    token: ClassVar[str | None] = None
    """Bearer token (None: ``$AGENTRL_ENV_TOKEN``)."""
    remote_env: ClassVar[str | None] = None
    """Environment name on the server (None: the only one it serves)."""
    timeout_s: ClassVar[float] = 120.0
    """Timeout of each request (a step runs its tools before answering)."""
    max_retries: ClassVar[int] = 4
    """Retries of a failed request (connection errors, timeouts, 429/502/503/504)."""
    backoff_s: ClassVar[float] = 0.25
    """First retry delay; doubles per retry (capped at 10 s)."""
    info: ClassVar[dict[str, Any]] = {}
    """The environment's description from ``GET /v1/envs`` (tools, limits), filled by ``bind``."""
    transport: ClassVar[httpx.AsyncBaseTransport | None] = None
    """Custom transport for the episodes' HTTP client (tests, proxies); None: plain TCP."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        env: str | None = None,
        *,
        timeout_s: float | None = None,
        max_retries: int | None = None,
    ) -> None:
        super().__init__()
        cls = type(self)
        self._url = url or cls.url
        if not self._url:
            raise MissingServerUrl("RemoteEnvironment needs the server's URL (or use RemoteEnvironment.bind)")
        self._env = env or cls.remote_env
        self._http_cfg = _Retrying(
            self._url,
            token or cls.token or os.environ.get(TOKEN_ENV),
            timeout_s or cls.timeout_s,
            cls.max_retries if max_retries is None else max_retries,
            cls.backoff_s,
        )
        self._http: httpx.AsyncClient | None = None
        self.session_id: str | None = None
        self.stop_reason: str | None = None
        self._tools: list[dict[str, Any]] = list(cls.info.get("tools", []))

    # ----- binding (class level, synchronous) ---------------------------------------------------------
    @classmethod
    def bind(
        cls,
        url: str,
        token: str | None = None,
        env: str | None = None,
        *,
        timeout_s: float = 120.0,
        max_retries: int = 4,
    ) -> type[RemoteEnvironment]:
        """A subclass bound to environment ``env`` on the server at ``url``, with its tools and limits.

        Raises ``RemoteEnvError`` when the server cannot be reached or does not serve ``env``."""
        token = token or os.environ.get(TOKEN_ENV)
        http = _Retrying(url, token, timeout_s, max_retries, cls.backoff_s)
        envs = (http.request_sync("GET", "/v1/envs") or {}).get("envs", [])
        names = [e["name"] for e in envs]
        if env is None and len(envs) == 1:
            info = envs[0]
        else:
            match = [e for e in envs if e["name"] == env]
            if not match:
                raise RemoteEnvError(f"env server {url} serves {names}, not {env!r}")
            info = match[0]
        attrs = {
            "name": info["name"],
            "system_prompt": info.get("system_prompt"),
            "max_turns": int(info["max_turns"]),
            "max_tokens_per_turn": int(info["max_tokens_per_turn"]),
            "tool_timeout_s": float(info["tool_timeout_s"]),
            "agent_time_limit_s": float(info["agent_time_limit_s"]),
            "wall_time_limit_s": float(info["wall_time_limit_s"]),
            "url": url.rstrip("/"),
            "token": token,
            "remote_env": info["name"],
            "timeout_s": timeout_s,
            "max_retries": max_retries,
            "info": info,
            "__doc__": info.get("description") or cls.__doc__,
            "_task_cache": {},
        }
        return type(f"Remote{info['name'].title().replace('-', '').replace('_', '')}", (cls,), attrs)

    @_either
    def tool_schemas(self_or_cls: Any) -> list[dict[str, Any]]:
        """The environment's OpenAI tool schemas (as the server describes them)."""
        if isinstance(self_or_cls, type):
            return list(self_or_cls.info.get("tools", []))
        return list(self_or_cls._tools)

    @classmethod
    def tasks(cls, split: str = "train") -> Sequence[Task]:
        """The server's dataset for ``split`` (fetched page by page once, then cached)."""
        if not cls.url:
            raise NoTasksError(
                "an unbound RemoteEnvironment has no dataset; use RemoteEnvironment.bind"
            )
        cache: dict[str, list[Task]] = cls.__dict__.get("_task_cache", {})
        if split not in cache:
            http = _Retrying(cls.url, cls.token, cls.timeout_s, cls.max_retries, cls.backoff_s)
            tasks: list[Task] = []
            while True:
                page = http.request_sync(
                    "GET",
                    f"/v1/envs/{cls.remote_env}/tasks",
                    params={"split": split, "offset": len(tasks), "limit": 1000},
                )
                tasks.extend(page["tasks"])
                if not page["tasks"] or len(tasks) >= page["total"]:
                    break
            cache[split] = tasks
        return [dict(t) for t in cache[split]]

    # ----- one episode ----------------------------------------------------------------------------------
    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(
                timeout=self._http_cfg.timeout,
                headers=self._http_cfg.headers,
                limits=httpx.Limits(max_connections=4, max_keepalive_connections=2),
                transport=type(self).transport,
                verify=tls_context(),
            )
        return self._http

    async def _call(self, method: str, path: str, **kw: Any) -> Any:
        return await self._http_cfg.request(self._client(), method, path, **kw)

    async def reset(self, task: Task) -> list[dict[str, Any]]:
        """Open a session on ``task``; returns the opening messages (system prompt included)."""
        if self.session_id is not None:
            raise EnvStateError(
                "this RemoteEnvironment already holds a session; create one instance per episode"
            )
        body: dict[str, Any] = {"env": self._env} if self._env else {}
        if type(self).info.get("accepts_task_payload", True):
            body["task"] = task
        else:
            body["task_id"] = str(task["id"])
        created = await self._call("POST", "/v1/sessions", json=body, key=uuid.uuid4().hex)
        self.session_id = created["session_id"]
        self.task = task
        self._tools = list(created["tools"])
        self.max_turns = int(created["max_turns"])
        return list(created["messages"])

    async def call_tool(self, name: str, arguments: Any) -> str:
        """One step with one tool call; tool failures are raised as the local loop expects them."""
        if self.session_id is None:
            raise EnvStateError("call reset() before call_tool()")
        body = {
            "tool_calls": [
                {
                    "id": f"call_{uuid.uuid4().hex[:12]}",
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            ],
            "count_turn": False,
        }
        result = await self._call(
            "POST", f"/v1/sessions/{self.session_id}/step", json=body, key=uuid.uuid4().hex
        )
        obs = result["observations"][0] if result["observations"] else None
        self.last_tool_s = obs.get("tool_s") if obs else None  # the server's measure, without the network
        if result["done"]:
            self.stop_reason = result.get("stop_reason")
            if self.stop_reason == "env_error":
                raise RemoteEnvError(
                    f"the remote environment failed: {result.get('error')}", code="env_error"
                )
            if self.stop_reason == "timeout":  # the server session ran out of agent time
                raise AgentTimeLimit(f"the server ended the episode: {result.get('error') or 'agent time used up'}")
            self.finished = True
        if obs is None:
            return ""
        kind, text = obs.get("error"), obs["content"]
        message = text[len("Error: ") :] if text.startswith("Error: ") else text
        if kind == "invalid_arguments":
            raise ToolArgumentError(message)
        if kind == "tool_error":
            raise ToolError(message)
        if kind == "timeout":
            raise ToolTimeoutError(message)
        return text

    async def reward(self, messages: list[Message]) -> dict[str, float]:
        """Score the episode on the server with this side's transcript."""
        if self.session_id is None:
            raise EnvStateError("call reset() before reward()")
        body = {"messages": [m.to_openai() if isinstance(m, Message) else m for m in messages]}
        result = await self._call("POST", f"/v1/sessions/{self.session_id}/reward", json=body)
        if result.get("stop_reason") == "env_error":
            raise RemoteEnvError(f"the remote environment failed: {result.get('error')}", code="env_error")
        return {
            "reward": float(result["reward"]),
            **{k: float(v) for k, v in result.get("metrics", {}).items()},
        }

    async def close(self) -> None:
        """Close the session (an unknown session is fine: it expired or the server restarted)."""
        try:
            if self.session_id is not None:
                sid, self.session_id = self.session_id, None
                try:
                    await self._call("DELETE", f"/v1/sessions/{sid}", ok_status=(404,), retries=1)
                except RemoteEnvError as e:
                    log.warning("could not close remote session %s: %s", sid, e)
        finally:
            if self._http is not None:
                await self._http.aclose()
                self._http = None
