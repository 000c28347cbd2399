"""The mapping between OpenEnv's reset/step/state (and MCP tool calls) and agentrl sessions.

Every OpenEnv or MCP episode is a :class:`agentrl.http.server.session.Session` opened by the server's one
:class:`agentrl.http.server.manager.SessionManager`, so session limits, TTL, idempotency and "failures are
data" are the same as on ``/v1``. This module only translates:

* ``reset`` data (``env``, ``task_id``, ``split``, ``task``, ``seed``) -> the task of a new session;
* a ``step`` action -> an agentrl step: the assistant's turn (``content``, ``tool_calls``: OpenAI shape),
  or one MCP tool call (``{"type": "call_tool", "tool_name", "arguments"}``), or a tool listing
  (``{"type": "list_tools"}``, which runs nothing);
* step results -> OpenEnv ``{observation, reward, done}`` and MCP ``CallToolResult`` shapes.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentrl.http.errors import ApiError
from agentrl.http.server.catalog import EnvCatalog
from agentrl.http.server.manager import SessionManager
from agentrl.http.server.protocol import (
    MAX_ID,
    CreateSession,
    FunctionCall,
    StepRequest,
    StepResult,
    ToolCallIn,
)
from agentrl.http.server.session import Session

ERROR_TYPES = {"invalid_arguments": "invalid_args", "tool_error": "execution_error", "timeout": "timeout",
               "env_error": "execution_error"}
"""agentrl observation errors -> OpenEnv ``ToolErrorType`` values."""


class ResetData(BaseModel):
    """``reset`` data: which task the new episode runs. Unknown fields (OpenEnv's ``episode_id``, ...) are
    ignored."""

    model_config = ConfigDict(extra="ignore", use_attribute_docstrings=True)

    env: str | None = Field(None, min_length=1, max_length=MAX_ID)
    """Environment name (default: the first one the server serves)."""
    task_id: str | None = Field(None, min_length=1, max_length=MAX_ID)
    """A task of the environment's dataset."""
    split: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    """Dataset split (default ``train``): where ``task_id`` is looked up, or ``seed`` picks from."""
    task: dict[str, Any] | None = None
    """A task object of the environment's format (needs the server's ``allow_task_payload``)."""
    seed: int | None = None
    """Without ``task_id``/``task``: picks task ``seed mod len(split)`` (no seed: a random task)."""


class CallTool(BaseModel):
    """An OpenEnv MCP action: one tool call, run as one step of the episode."""

    model_config = ConfigDict(extra="ignore", use_attribute_docstrings=True)

    type: Literal["call_tool"]
    """``call_tool``."""
    tool_name: str = Field(..., min_length=1, max_length=MAX_ID)
    """Tool to call."""
    arguments: dict[str, Any] = Field(default_factory=dict)
    """Its arguments."""
    count_turn: bool = True
    """Whether this call is a model turn for the environment's ``max_turns``."""


class ListTools(BaseModel):
    """An OpenEnv MCP action listing the tools (runs nothing; not a step)."""

    type: Literal["list_tools"]
    """``list_tools``."""


Action = StepRequest | CallTool | ListTools


def action_schema() -> dict[str, Any]:
    """JSON schema of the actions ``step`` accepts."""
    return {"anyOf": [StepRequest.model_json_schema(), CallTool.model_json_schema(),
                      ListTools.model_json_schema()]}


def parse_action(data: Any) -> Action:
    """The action a ``step`` carries. Raises ``ValidationError`` or ``ApiError(422)``."""
    if not isinstance(data, dict):
        raise ApiError(422, f"an action must be a JSON object, got {type(data).__name__}")
    kind = data.get("type")
    if kind == "call_tool":
        return CallTool.model_validate(data)
    if kind == "list_tools":
        return ListTools.model_validate(data)
    if "content" not in data and "tool_calls" not in data:
        raise ApiError(422, "an action is an assistant turn ({'content': ..., 'tool_calls': [...]}) or an MCP "
                            "action ({'type': 'call_tool', 'tool_name': ..., 'arguments': {...}} or "
                            "{'type': 'list_tools'})")
    return StepRequest.model_validate(data)


def mcp_tools(catalog: EnvCatalog, env: str) -> list[dict[str, Any]]:
    """The tools of ``env`` in MCP's shape (``name``, ``description``, ``inputSchema``)."""
    out = []
    for schema in catalog.classes[env].tool_schemas():
        fn = schema["function"]
        out.append({"name": fn["name"], "description": fn.get("description", ""),
                    "inputSchema": fn.get("parameters", {"type": "object", "properties": {}})})
    return out


def tool_list_observation(catalog: EnvCatalog, env: str) -> dict[str, Any]:
    """The OpenEnv result of a ``list_tools`` action."""
    tools = [{"name": t["name"], "description": t["description"], "input_schema": t["inputSchema"]}
             for t in mcp_tools(catalog, env)]
    return {"observation": {"tools": tools}, "reward": None, "done": False}


def _episode_fields(result: StepResult) -> dict[str, Any]:
    return {"messages": result.messages, "stop_reason": result.stop_reason.value if result.stop_reason else None,
            "metrics": result.metrics, "turn": result.turn, "env_error": result.error}


def turn_observation(result: StepResult) -> dict[str, Any]:
    """The OpenEnv result of an assistant-turn step."""
    obs = {"observations": [o.model_dump(mode="json") for o in result.observations], **_episode_fields(result)}
    return {"observation": obs, "reward": result.reward, "done": result.done}


def call_result(result: StepResult) -> dict[str, Any]:
    """An MCP ``CallToolResult`` of a one-call step (the episode's state under ``_meta.agentrl``)."""
    o = result.observations[0] if result.observations else None
    text = o.content if o is not None else "(not run: the episode is over)"
    return {"content": [{"type": "text", "text": text}], "isError": o is None or o.error is not None,
            "data": text, "_meta": {"agentrl": {"done": result.done, "reward": result.reward,
                                                "tool_error": o.error if o else None, **_episode_fields(result)}}}


def call_observation(name: str, result: StepResult) -> dict[str, Any]:
    """The OpenEnv result of a ``call_tool`` step (``CallToolObservation`` fields). Only a call that never
    ran (unknown tool, bad arguments, timeout) sets ``error``; a tool that reports a problem is a result."""
    o = result.observations[0] if result.observations else None
    error = None
    if o is not None and o.error in ("invalid_arguments", "timeout"):
        kind = "tool_not_found" if o.content.startswith("Error: unknown tool") else ERROR_TYPES[o.error]
        error = {"error_type": kind, "message": o.content}
    obs = {"tool_name": name, "result": call_result(result), "error": error, **_episode_fields(result)}
    return {"observation": obs, "reward": result.reward, "done": result.done}


class OpenEnvSessions:
    """Opens, steps and describes sessions for the OpenEnv and MCP routes, through the session manager."""

    def __init__(self, manager: SessionManager, catalog: EnvCatalog) -> None:
        self.manager = manager
        self.catalog = catalog

    def env_name(self, env: str | None) -> str:
        """A served environment's name (default: the first served). Raises ``ApiError(404)``."""
        return self.catalog.resolve(env or self.catalog.names[0])[0]

    async def open(self, data: Any, client: str) -> tuple[Session, dict[str, Any]]:
        """Open a session on the task ``data`` (``ResetData``) names; (session, OpenEnv reset result)."""
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ApiError(422, f"reset data must be a JSON object, got {type(data).__name__}")
        req = ResetData.model_validate(data)
        name = self.env_name(req.env)
        if req.task_id is not None or req.task is not None:
            create = CreateSession(env=name, task_id=req.task_id, split=req.split, task=req.task)
        else:
            split = req.split or "train"
            tasks = await asyncio.to_thread(self.catalog.dataset, name, split)
            if not tasks:
                raise ApiError(404, f"split {split!r} of {name!r} is empty")
            i = req.seed % len(tasks) if req.seed is not None else random.randrange(len(tasks))
            create = CreateSession(env=name, task_id=str(tasks[i]["id"]), split=split)
        created = await self.manager.create(create, client)
        session = self.manager.get(created.session_id)
        obs = {"session_id": created.session_id, "env": created.env, "task_id": created.task_id,
               "messages": created.messages, "tools": created.tools, "max_turns": created.max_turns}
        return session, {"observation": obs, "reward": None, "done": False}

    async def step(self, session_id: str, action: Action, key: str | None = None) -> dict[str, Any]:
        """Run ``action`` in the session; the OpenEnv step result."""
        session = self.manager.get(session_id)
        if isinstance(action, ListTools):
            session.touch()
            return tool_list_observation(self.catalog, session.env_name)
        if isinstance(action, CallTool):
            cid = f"call_{hashlib.sha256(key.encode()).hexdigest()[:12]}" if key else None  # a retry is the same
            result = await session.step(self.one_call(action.tool_name, action.arguments, action.count_turn, cid),
                                        key)
            return call_observation(action.tool_name, result)
        return turn_observation(await session.step(action, key))

    @staticmethod
    def one_call(name: str, arguments: dict[str, Any], count_turn: bool = True, cid: str | None = None) -> StepRequest:
        """A step running one tool call (``cid``: its call id; default a fresh one)."""
        call = ToolCallIn(id=cid or f"call_{uuid.uuid4().hex[:12]}", function=FunctionCall(name=name, arguments=arguments))
        return StepRequest(content="", tool_calls=[call], count_turn=count_turn)

    def state(self, session_id: str | None) -> dict[str, Any]:
        """OpenEnv ``State`` (``episode_id``, ``step_count``) plus the session's state."""
        if session_id is None:
            return {"episode_id": None, "step_count": 0}
        session = self.manager.get(session_id)
        session.touch()
        return {"episode_id": session.id, "step_count": session.steps, **session.state().model_dump(mode="json")}


def validation_detail(e: ValidationError) -> list[dict[str, Any]]:
    """Validation problems without the offending input."""
    return [{"loc": [str(p) for p in err["loc"]], "msg": str(err["msg"])[:300], "type": err["type"]}
            for err in e.errors()[:20]]
