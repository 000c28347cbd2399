"""`OpenEnvEnvironment`: an environment served by any OpenEnv server, as a drop-in `Environment`.

``agentrl train --env openenv:<url>`` (or ``load_env("openenv:<url>")``) binds one: the server's MCP tools
(``tools/list`` on ``<url>/mcp``) become the agent's tools, each of the agent's tool calls is one OpenEnv
``step`` with a ``call_tool`` action over the episode's WebSocket (``<url>/ws``), the observation's tool
result is the tool message, and the rewards the server returns are the episode's reward (their sum; 0
when it gave none). A tool result with ``done`` ends the episode.

Tasks: OpenEnv environments choose their task at ``reset`` (usually from a seed), so a split is a list of
seeds: ``train`` is seeds 0..9999, ``test`` seeds 1000000..1000499 (disjoint). The opening prompt is the
reset observation's ``prompt``/``question``/``instructions``/``text``/``message`` (the first that is a
string), or its ``messages`` when it carries chat messages, else the observation as JSON. A server whose
actions include the assistant's turn (agentrl's own, through its capability URL) also gets the model's
final answer, so environments that score it (calc) work too.

Every network call has a timeout; a broken connection or a server error ends the episode as an
environment failure (recorded as data, like any other).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any, ClassVar

import httpx

from agentrl.core.errors import EnvError
from agentrl.core.types import message_field
from agentrl.environment.base import (
    Environment,
    EnvStateError,
    Task,
    ToolArgumentError,
    ToolError,
    ToolTimeoutError,
)
from agentrl.environment.tasks import TaskSourceError

log = logging.getLogger(__name__)

PREFIX = "openenv:"
"""``--env`` prefix naming an OpenEnv server by its base URL."""
PROMPT_KEYS = ("prompt", "question", "instructions", "text", "message")
"""Reset-observation fields read as the opening prompt, in this order."""
SPLITS = {"train": (0, 10_000), "test": (1_000_000, 500)}
"""split -> (first seed, number of tasks)."""


class OpenEnvError(EnvError, RuntimeError):
    """The OpenEnv server was unreachable, refused a request, or answered an error."""

    code = "env.openenv"


def _ws_url(base: str) -> str:
    base = base.rstrip("/")
    for http, ws in (("http://", "ws://"), ("https://", "wss://")):
        if base.startswith(http):
            return ws + base[len(http):] + "/ws"
    return base + "/ws"


def _text_of(result: Any) -> tuple[str, bool]:
    """(text, is_error) of an MCP tool result as OpenEnv servers return it."""
    if isinstance(result, dict):
        is_error = bool(result.get("isError", result.get("is_error", False)))
        content = result.get("content")
        if isinstance(content, list):
            texts = [c.get("text", "") for c in content if isinstance(c, dict) and c.get("type") == "text"]
            if texts:
                return "\n".join(texts), is_error
        if "data" in result:
            data = result["data"]
            return (data if isinstance(data, str) else json.dumps(data)), is_error
        return json.dumps(result), is_error
    if result is None:
        return "", False
    return (result if isinstance(result, str) else json.dumps(result)), False


def _takes_turns(action_schema: Any) -> bool:
    """Whether an OpenEnv action schema has an assistant-turn form (a ``content`` property)."""
    if not isinstance(action_schema, dict):
        return False
    forms = action_schema.get("anyOf") or action_schema.get("oneOf") or [action_schema]
    return any(isinstance(f, dict) and "content" in (f.get("properties") or {}) for f in forms)


def opening(observation: dict[str, Any]) -> str | list[dict[str, Any]]:
    """The opening prompt (or chat messages) of a reset observation."""
    messages = observation.get("messages")
    if isinstance(messages, list) and messages and all(isinstance(m, dict) and "role" in m for m in messages):
        return messages
    for key in PROMPT_KEYS:
        if isinstance(observation.get(key), str):
            return observation[key]
    return json.dumps(observation)


class OpenEnvEnvironment(Environment):
    """An environment on an OpenEnv server (see the module docstring); ``bind(url)`` returns the class."""

    url: ClassVar[str] = ""
    """Base URL of the OpenEnv server (for an ``agentrl serve-env`` server: its capability URL)."""
    timeout_s: ClassVar[float] = 120.0
    """Timeout of each request and each WebSocket reply."""
    tools: ClassVar[list[dict[str, Any]]] = []
    """The server's tools as OpenAI function schemas, filled by ``bind``."""
    accepts_turns: ClassVar[bool] = False
    """Whether the server's actions include an assistant turn (``content``; agentrl's servers do): then an
    episode the model ends with a final answer sends that answer as a last step, which the server scores."""

    def __init__(self) -> None:
        super().__init__()
        self._ws: Any = None
        self._rewards: list[float] = []

    @classmethod
    def bind(cls, url: str, *, timeout_s: float = 120.0) -> type[OpenEnvEnvironment]:
        """A subclass bound to the OpenEnv server at ``url`` with its tools. Raises ``OpenEnvError``."""
        url = url.rstrip("/")
        try:
            with httpx.Client(timeout=timeout_s) as http:
                r = http.post(url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
                r.raise_for_status()
                listed = r.json()
                meta = http.get(url + "/metadata")
                info = meta.json() if meta.status_code == 200 else {}
                schema = http.get(url + "/schema")
                action = schema.json().get("action", {}) if schema.status_code == 200 else {}
        except (httpx.HTTPError, ValueError) as e:
            raise OpenEnvError(f"OpenEnv server {url}: tools/list failed: {type(e).__name__}: {e}") from None
        if "error" in listed:
            raise OpenEnvError(f"OpenEnv server {url}: tools/list failed: {listed['error'].get('message')}")
        tools = [{"type": "function", "function": {
            "name": t["name"], "description": t.get("description") or "",
            "parameters": t.get("inputSchema") or t.get("input_schema") or {"type": "object", "properties": {}}}}
            for t in listed.get("result", {}).get("tools", [])]
        if not tools:
            raise OpenEnvError(f"OpenEnv server {url} lists no MCP tools: the agent would have nothing to call")
        name = str(info.get("name") or "openenv")
        return type(f"OpenEnv{name.title().replace('-', '').replace('_', '')}", (cls,), {
            "name": name, "url": url, "timeout_s": timeout_s, "tools": tools, "accepts_turns": _takes_turns(action),
            "__doc__": info.get("description") or cls.__doc__, "_tool_spec_cache": {}})

    @classmethod
    def tool_schemas(cls) -> list[dict[str, Any]]:
        """The server's tools (OpenAI function schemas)."""
        return list(cls.tools)

    @classmethod
    def tasks(cls, split: str = "train") -> Sequence[Task]:
        """Seeds of ``split`` (``train`` or ``test``)."""
        if split not in SPLITS:
            raise TaskSourceError(f"an OpenEnv environment has splits {sorted(SPLITS)}, not {split!r}")
        first, n = SPLITS[split]
        return [{"id": f"{split}-{i}", "seed": first + i} for i in range(n)]

    async def _request(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self._ws is not None
        await self._ws.send(json.dumps(message))
        reply = json.loads(await asyncio.wait_for(self._ws.recv(), timeout=self.timeout_s))
        if reply.get("type") == "error":
            data = reply.get("data") or {}
            raise OpenEnvError(f"OpenEnv server {self.url}: {data.get('message')} (code {data.get('code')})")
        return reply.get("data") or {}

    async def reset(self, task: Task) -> str | list[dict[str, Any]]:
        """Connect and reset the server's environment with the task's seed; the opening prompt."""
        from websockets.asyncio.client import connect

        self.task = task
        try:
            self._ws = await connect(_ws_url(self.url), open_timeout=min(30.0, self.timeout_s),
                                     max_size=64 << 20)
        except Exception as e:
            raise OpenEnvError(f"cannot connect to OpenEnv server {self.url}: {type(e).__name__}: {e}") from None
        data = {k: v for k, v in task.items() if k != "id"}
        result = await self._request({"type": "reset", "data": data})
        self._record(result)
        return opening(result.get("observation") or {})

    def _record(self, result: dict[str, Any]) -> None:
        if isinstance(result.get("reward"), (int, float)):
            self._rewards.append(float(result["reward"]))
        if result.get("done"):
            self.finished = True

    async def call_tool(self, name: str, arguments: Any) -> str:
        """One ``call_tool`` step; tool failures are raised as the agent loop expects them."""
        if self._ws is None:
            raise EnvStateError("call reset() before call_tool()")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as e:
                raise ToolArgumentError(f"arguments are not valid JSON: {e.msg}") from None
        if not isinstance(arguments, dict):
            raise ToolArgumentError("arguments must be a JSON object")
        action: dict[str, Any] = {"type": "call_tool", "tool_name": name, "arguments": arguments}
        if type(self).accepts_turns:  # the agent loop counts the model's turns itself
            action["count_turn"] = False
        result = await self._request({"type": "step", "data": action})
        self._record(result)
        obs = result.get("observation") or {}
        error = obs.get("error")
        if isinstance(error, dict):
            kind, message = error.get("error_type"), str(error.get("message", ""))
            if kind in ("tool_not_found", "invalid_args"):
                raise ToolArgumentError(message)
            if kind == "timeout":
                raise ToolTimeoutError(message)
            raise ToolError(message)
        text, is_error = _text_of(obs.get("result"))
        if is_error:
            raise ToolError(text)
        return text

    async def reward(self, messages: list[Any]) -> dict[str, float]:
        """The sum of the rewards the server returned in this episode (0 when none). An episode the model
        ended with a final answer sends it first, as a last turn, to a server that takes turns."""
        if type(self).accepts_turns and not self.finished and self._ws is not None:
            final = next((m for m in reversed(messages) if message_field(m, "role") == "assistant"), None)
            if final is not None and not message_field(final, "tool_calls"):
                self._record(await self._request({"type": "step", "data": {"content": message_field(final, "content") or ""}}))
        return {"reward": float(sum(self._rewards)), "server_rewards": float(len(self._rewards))}

    async def close(self) -> None:
        """Send ``close`` and drop the connection (the server releases the episode's environment)."""
        ws, self._ws = self._ws, None
        if ws is None:
            return
        try:
            await asyncio.wait_for(ws.send(json.dumps({"type": "close"})), timeout=5)
        except Exception:
            pass
        try:
            await asyncio.wait_for(ws.close(), timeout=5)
        except Exception as e:
            log.warning("closing the OpenEnv connection to %s failed: %s", self.url, e)
