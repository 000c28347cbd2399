"""MCP over HTTP at ``/openenv/<capability>/mcp``: JSON-RPC 2.0 ``initialize``, ``tools/list``,
``tools/call`` and ``ping``, plus OpenEnv's ``openenv/session/create`` and ``openenv/session/close``.

Two kinds of clients use it unchanged:

* the ``mcp`` SDK (streamable HTTP, handshake protocol versions): ``initialize`` opens a session (an
  agentrl episode on a task; its opening prompt is the result's ``instructions``) and answers its id in
  the ``Mcp-Session-Id`` header, which later requests carry; ``DELETE`` closes it;
* OpenEnv's ``MCPToolClient`` (production mode): ``openenv/session/create`` returns ``session_id``, which
  ``tools/list`` and ``tools/call`` carry in their params.

Each ``tools/call`` is one step of the episode (one tool call, one turn). Tool failures are results with
``isError: true``; the episode's ``done``, ``reward`` and ``stop_reason`` are in the result's
``_meta.agentrl``. Answers are JSON (never an SSE stream), as streamable HTTP allows.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from agentrl import __version__
from agentrl.core.errors import AgentRLError
from agentrl.http.errors import ApiError
from agentrl.http.server.capability import verify
from agentrl.http.server.openenv_map import OpenEnvSessions, call_result, mcp_tools, validation_detail

log = logging.getLogger("agentrl.http.server")

PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
"""MCP protocol versions this server speaks (the handshake era), newest first."""

SESSION_HEADER = "mcp-session-id"

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = (
    -32700, -32600, -32601, -32602, -32603)
SERVER_ERROR = -32000


class RpcError(AgentRLError):
    """A JSON-RPC error answer; ``rpc_code`` is its JSON-RPC error code (``INVALID_PARAMS``, ...)."""

    code = "mcp.rpc_error"

    def __init__(self, rpc_code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.rpc_code, self.message, self.data = rpc_code, message, data


def _error(rid: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": rid, "error": err}


def _rpc_of(e: ApiError) -> RpcError:
    return RpcError(INVALID_PARAMS if e.status in (404, 422) else SERVER_ERROR, e.message,
                    {"error": e.code, "status": e.status})


class McpEndpoint:
    """Answers the JSON-RPC requests of one server."""

    def __init__(self, sessions: OpenEnvSessions) -> None:
        self.sessions = sessions

    async def call(self, method: str, params: dict[str, Any], header_sid: str | None,
                   client: str) -> tuple[Any, str | None]:
        """(result, a new session id to answer in ``Mcp-Session-Id``)."""
        if method == "initialize":
            version = params.get("protocolVersion")
            meta = params.get("_meta")
            task = meta.get("agentrl") if isinstance(meta, dict) else None
            session, opened = await self.sessions.open(task or {}, client)
            prompt = "\n\n".join(m.get("content") or "" for m in opened["observation"]["messages"])
            return {
                "protocolVersion": version if version in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0],
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": "agentrl", "version": __version__},
                "instructions": prompt,
            }, session.id
        if method == "ping":
            return {}, None
        if method == "openenv/session/create":
            session, opened = await self.sessions.open(params, client)
            obs = opened["observation"]
            return {"session_id": session.id, "task_id": obs["task_id"], "messages": obs["messages"]}, None
        if method == "openenv/session/close":
            sid = params.get("session_id")
            if not isinstance(sid, str) or not sid:
                raise RpcError(INVALID_PARAMS, "Invalid params - 'session_id' is required")
            if not await self.sessions.manager.close(sid, "client"):
                raise RpcError(INVALID_PARAMS, f"Unknown session_id: {sid[:64]}")
            return {"session_id": sid, "closed": True}, None
        sid = params.get("session_id") or header_sid
        if method == "tools/list":
            env = self.sessions.manager.get(sid).env_name if sid else self.sessions.env_name(None)
            return {"tools": mcp_tools(self.sessions.catalog, env)}, None
        if method == "tools/call":
            name = params.get("name")
            arguments = params.get("arguments") or {}
            if not isinstance(name, str) or not name:
                raise RpcError(INVALID_PARAMS, "Missing 'name' in params")
            if not isinstance(arguments, dict):
                raise RpcError(INVALID_PARAMS, "'arguments' must be an object")
            if not sid:
                raise RpcError(INVALID_PARAMS, "no session: call 'initialize' (Mcp-Session-Id) or "
                                               "'openenv/session/create' (session_id) first")
            session = self.sessions.manager.get(sid)
            result = await session.step(self.sessions.one_call(name, arguments), None)
            return call_result(result), None
        raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method[:64]}")

    async def answer(self, body: bytes, header_sid: str | None, client: str) -> Response:
        """The HTTP answer to one POSTed JSON-RPC message."""
        try:
            msg = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            return JSONResponse(_error(None, PARSE_ERROR, "Parse error"))
        if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0" or not isinstance(msg.get("method"), str):
            rid = msg.get("id") if isinstance(msg, dict) else None
            return JSONResponse(_error(rid, INVALID_REQUEST, "Invalid Request: a JSON-RPC 2.0 object with a "
                                                             "'method' is expected"))
        if "id" not in msg:  # a notification (notifications/initialized, cancelled, ...): nothing to answer
            return Response(status_code=202)
        rid, params = msg["id"], msg.get("params") or {}
        if not isinstance(params, dict):
            return JSONResponse(_error(rid, INVALID_PARAMS, "Params must be an object"))
        if header_sid is not None and msg["method"] != "initialize":
            session = self.sessions.manager.sessions.get(header_sid)
            if session is None or session.closed:
                return JSONResponse(_error(rid, INVALID_REQUEST, "Session not found (closed or expired)"),
                                    status_code=404)
        try:
            result, new_sid = await self.call(msg["method"], params, header_sid, client)
        except RpcError as e:
            return JSONResponse(_error(rid, e.rpc_code, e.message, e.data))
        except ApiError as e:
            err = _rpc_of(e)
            return JSONResponse(_error(rid, err.rpc_code, err.message, err.data))
        except ValidationError as e:
            return JSONResponse(_error(rid, INVALID_PARAMS, "Invalid params", validation_detail(e)))
        except Exception as e:  # a bug: logged, answered as JSON-RPC, never a stack trace
            log.exception("MCP %s failed", msg["method"][:64])
            return JSONResponse(_error(rid, INTERNAL_ERROR, f"internal error: {type(e).__name__}"))
        headers = {"Mcp-Session-Id": new_sid} if new_sid else None
        return JSONResponse({"jsonrpc": "2.0", "id": rid, "result": result}, headers=headers)


def mcp_router(sessions: OpenEnvSessions, token: str | None) -> APIRouter:
    """``POST``/``GET``/``DELETE /openenv/{capability}/mcp``."""
    router = APIRouter(prefix="/openenv/{capability}", tags=["mcp"], include_in_schema=False)
    endpoint = McpEndpoint(sessions)

    def check(capability: str) -> None:
        if verify(token, capability) is None:
            raise ApiError(401, "invalid capability URL: ask the server's operator for yours")

    @router.post("/mcp")
    async def mcp_post(capability: str, request: Request) -> Response:
        """One JSON-RPC request or notification."""
        check(capability)
        client = request.client.host if request.client else "unknown"
        return await endpoint.answer(await request.body(), request.headers.get(SESSION_HEADER), client)

    @router.get("/mcp")
    async def mcp_get(capability: str) -> Response:
        """No server-initiated stream: 405, as streamable HTTP allows."""
        check(capability)
        return Response(status_code=405, headers={"Allow": "POST, DELETE"})

    @router.delete("/mcp")
    async def mcp_delete(capability: str, request: Request) -> Response:
        """End the MCP session named by ``Mcp-Session-Id`` (its environment is released)."""
        check(capability)
        sid = request.headers.get(SESSION_HEADER)
        if not sid or not await sessions.manager.close(sid, "client"):
            raise ApiError(404, "no such MCP session")
        return Response(status_code=204)

    return router
