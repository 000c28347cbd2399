"""OpenEnv routes under ``/openenv/<capability>``: the WebSocket session ``/ws`` and the HTTP routes
``/reset``, ``/step``, ``/state``, ``/close``, ``/schema``, ``/metadata``, ``/health``.

Stock ``openenv-core`` clients talk to these unchanged, given the capability URL as their base URL. A
WebSocket is one connection holding at most one session (an agentrl episode) at a time: ``reset`` closes
the previous one and opens the next; ``close`` or a dropped connection closes it (its environment and
sandboxes are released at once). Replies follow OpenEnv: ``observation``, ``state`` or ``error`` (with
``message`` and ``code``), and a bad message never ends the connection.
"""

from __future__ import annotations

import inspect
import json
import logging
from typing import Any

from fastapi import APIRouter, Query, Request, WebSocket
from pydantic import ValidationError
from starlette.websockets import WebSocketDisconnect

from agentrl import __version__
from agentrl.http.errors import ApiError
from agentrl.http.server.capability import verify
from agentrl.http.server.openenv_map import OpenEnvSessions, action_schema, parse_action, validation_detail
from agentrl.http.server.protocol import SessionState

log = logging.getLogger("agentrl.http.server")

WS_CODES = {422: "VALIDATION_ERROR", 429: "CAPACITY_REACHED", 403: "VALIDATION_ERROR"}
"""HTTP status of an ``ApiError`` -> OpenEnv WebSocket error code (others: ``SESSION_ERROR``)."""

MAX_SESSION_ID = 64


def ws_error(message: str, code: str, **extra: Any) -> dict[str, Any]:
    """An OpenEnv WebSocket error reply."""
    return {"type": "error", "data": {"message": message, "code": code, **extra}}


def _api_error(e: ApiError) -> dict[str, Any]:
    code = "EXECUTION_ERROR" if e.code == "env_error" else WS_CODES.get(e.status, "SESSION_ERROR")
    return ws_error(e.message, code, error=e.code, status=e.status)


def _invalid(e: ValidationError, prefix: str = "") -> ApiError:
    detail = validation_detail(e)
    return ApiError(422, prefix + "; ".join(f"{'.'.join(d['loc'])}: {d['msg']}" for d in detail[:5]))


async def _json(request: Request, *, required: bool = True) -> Any:
    """The request's JSON body, read after the capability was checked; a JSON object (or nothing, when
    not ``required``). Raises ``ApiError(422)``."""
    raw = await request.body()
    if not raw.strip() and not required:
        return None
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise ApiError(422, "the request body is not valid JSON") from None
    if not isinstance(body, dict) and (required or body is not None):
        raise ApiError(422, f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _client(host: Any) -> str:
    return host.host if host else "unknown"


class WsConnection:
    """One OpenEnv WebSocket connection and the session it holds."""

    def __init__(self, sessions: OpenEnvSessions, client: str) -> None:
        self.sessions = sessions
        self.client = client
        self.session_id: str | None = None

    async def release(self, reason: str) -> None:
        """Close the connection's session, if any."""
        sid, self.session_id = self.session_id, None
        if sid is not None:
            await self.sessions.manager.close(sid, reason)

    async def handle(self, raw: str) -> tuple[dict[str, Any] | None, bool]:
        """(reply, whether to end the connection) for one client message."""
        try:
            message = json.loads(raw)
        except (json.JSONDecodeError, RecursionError) as e:
            return ws_error(f"Invalid JSON: {getattr(e, 'msg', e)}", "INVALID_JSON"), False
        if not isinstance(message, dict):
            return ws_error("a message must be a JSON object with a 'type'", "VALIDATION_ERROR"), False
        kind = message.get("type")
        try:
            if kind == "reset":
                await self.release("reset")
                session, result = await self.sessions.open(message.get("data"), self.client)
                self.session_id = session.id
                return {"type": "observation", "data": result}, False
            if kind == "step":
                if self.session_id is None:
                    return ws_error("no episode: send 'reset' first", "SESSION_ERROR"), False
                action = parse_action(message.get("data"))
                key = message.get("request_id")
                key = key if isinstance(key, str) and 0 < len(key) <= 256 else None
                return {"type": "observation", "data": await self.sessions.step(self.session_id, action, key)}, False
            if kind == "state":
                return {"type": "state", "data": self.sessions.state(self.session_id)}, False
            if kind == "close":
                return None, True
            return ws_error(f"Unknown message type: {str(kind)[:64]}", "UNKNOWN_TYPE"), False
        except ValidationError as e:
            return ws_error("Invalid message", "VALIDATION_ERROR", errors=validation_detail(e)), False
        except ApiError as e:
            return _api_error(e), False

    async def serve(self, websocket: WebSocket) -> None:
        """Answer the accepted ``websocket``'s messages until the client closes it or sends ``close``, then
        release the session."""
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                raw = message.get("text")
                if raw is None:
                    try:
                        raw = (message.get("bytes") or b"").decode()
                    except UnicodeDecodeError:
                        raw = ""
                try:
                    reply, end = await self.handle(raw)
                except Exception as e:  # a bug must not kill the connection silently
                    log.exception("OpenEnv WebSocket message failed")
                    reply, end = ws_error(f"internal error: {type(e).__name__}", "EXECUTION_ERROR"), False
                if reply is not None:
                    await websocket.send_text(json.dumps(reply))
                if end:
                    await websocket.close()
                    break
        except WebSocketDisconnect:
            pass
        finally:
            try:
                await self.release("disconnect")
            except Exception:
                log.exception("closing the session of a WebSocket failed")


def openenv_router(sessions: OpenEnvSessions, token: str | None) -> APIRouter:
    """The OpenEnv routes; every one checks the capability in its path first."""
    router = APIRouter(prefix="/openenv/{capability}", tags=["openenv"], include_in_schema=False)
    _add_ws_route(router, sessions, token)
    _add_session_routes(router, sessions, token)
    _add_info_routes(router, sessions, token)
    return router


def _check(token: str | None, capability: str) -> str:
    """The client named by ``capability`` (signed with ``token``); raises ``ApiError(401)`` when invalid."""
    client = verify(token, capability)
    if client is None:
        raise ApiError(401, "invalid capability URL: ask the server's operator for yours")
    return client


def _add_ws_route(router: APIRouter, sessions: OpenEnvSessions, token: str | None) -> None:
    """``/ws``: the OpenEnv WebSocket session (a connection refused before it is accepted, for a bad
    capability)."""

    @router.websocket("/ws")
    async def ws(websocket: WebSocket, capability: str) -> None:
        if verify(token, capability) is None:
            await websocket.close(code=1008, reason="invalid capability URL")  # refused before accept: 403
            return
        await websocket.accept()
        conn = WsConnection(sessions, _client(websocket.client))
        await conn.serve(websocket)


def _add_session_routes(router: APIRouter, sessions: OpenEnvSessions, token: str | None) -> None:
    """The HTTP session routes: ``/reset``, ``/step``, ``/state`` and ``/close``."""

    @router.post("/reset")
    async def reset(capability: str, request: Request) -> dict[str, Any]:
        """Open a session (the environment is reset on a task); the observation carries its
        ``session_id``, to send with ``/step``, ``/state`` and ``/close``."""
        _check(token, capability)
        body = await _json(request, required=False)
        try:
            _, result = await sessions.open(body, _client(request.client))
        except ValidationError as e:
            raise _invalid(e) from None
        return result

    @router.post("/step")
    async def step(capability: str, request: Request) -> dict[str, Any]:
        """``{"action": {...}, "session_id": ..., "request_id"?}``: one step of the session (a repeated
        ``request_id`` returns the first result: tools never run twice)."""
        _check(token, capability)
        body = await _json(request)
        sid = body.get("session_id")
        if not isinstance(sid, str) or not 0 < len(sid) <= MAX_SESSION_ID:
            raise ApiError(422, "'session_id' is required: the one /reset returned in its observation "
                                "(this server keeps the environment between requests)")
        key = body.get("request_id")
        key = key if isinstance(key, str) and 0 < len(key) <= 256 else None
        try:
            action = parse_action(body.get("action"))
        except ValidationError as e:
            raise _invalid(e, "invalid action: ") from None
        return await sessions.step(sid, action, key)

    @router.get("/state")
    async def state(
        capability: str, session_id: str | None = Query(None, min_length=1, max_length=MAX_SESSION_ID)
    ) -> dict[str, Any]:
        """The session's state (OpenEnv ``episode_id``, ``step_count``, and agentrl's session state)."""
        _check(token, capability)
        return sessions.state(session_id)

    @router.post("/close")
    async def close(capability: str, request: Request) -> dict[str, Any]:
        """``{"session_id": ...}``: release the session's environment now (else its idle TTL does)."""
        _check(token, capability)
        body = await _json(request)
        sid = body.get("session_id")
        if not isinstance(sid, str):
            raise ApiError(422, "'session_id' is required")
        sessions.manager.get(sid)
        await sessions.manager.close(sid, "client")
        return {"session_id": sid, "closed": True}


def _add_info_routes(router: APIRouter, sessions: OpenEnvSessions, token: str | None) -> None:
    """The descriptive routes: ``/schema``, ``/metadata`` and ``/health``."""

    @router.get("/schema")
    async def schema(capability: str) -> dict[str, Any]:
        """JSON schemas of actions, observations and state."""
        _check(token, capability)
        return {"action": action_schema(), "observation": {"type": "object"},
                "state": SessionState.model_json_schema()}

    @router.get("/metadata")
    async def metadata(capability: str, env: str | None = Query(None, max_length=256)) -> dict[str, Any]:
        """Name and description of an environment (default: the first served)."""
        _check(token, capability)
        name = sessions.env_name(env)
        doc = inspect.getdoc(sessions.catalog.classes[name]) or ""
        return {"name": name, "description": doc.split("\n\n")[0].strip(), "readme_content": doc or None,
                "version": __version__, "author": None, "documentation_url": None}

    @router.get("/health")
    async def health(capability: str) -> dict[str, Any]:
        """``{"status": "healthy"}``."""
        _check(token, capability)
        return {"status": "healthy"}
