"""The FastAPI application of the environment server: routes, lifespan, middleware, OpenAPI spec."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import Body, Depends, FastAPI, Header, Path, Query, Request
from fastapi.responses import PlainTextResponse

from agentrl import __version__
from agentrl.config.server import ServerConfig
from agentrl.core.utils import heap
from agentrl.http.auth import BearerAuth, TokenError, make_auth
from agentrl.http.errors import install_error_handlers
from agentrl.http.limits import BodyLimit
from agentrl.http.server.capability import CLIENT_PATTERN
from agentrl.http.server.capability import base_url as capability_url
from agentrl.http.server.catalog import EnvCatalog
from agentrl.http.server.manager import SessionManager
from agentrl.http.server.mcp import mcp_router
from agentrl.http.server.metrics import Metrics, RequestMetrics
from agentrl.http.server.openenv import openenv_router
from agentrl.http.server.openenv_map import OpenEnvSessions
from agentrl.http.server.protocol import (
    Closed,
    CreateSession,
    EnvList,
    ErrorBody,
    Health,
    RewardRequest,
    RewardResult,
    RolloutRequest,
    RolloutResult,
    SessionCreated,
    SessionState,
    StepRequest,
    StepResult,
    TaskList,
)
from agentrl.http.server.rollouts import RolloutService

log = logging.getLogger("agentrl.http.server")

DESCRIPTION = """\
Serves agentrl environments over HTTP so that agents outside this process (any language, any framework)
can run episodes: open a session on a task, send the model's turns as steps, read tool observations,
the end of the episode and its reward, then close the session. `POST /v1/rollouts` instead runs a whole
episode here against the caller's inference server and returns its token-level trajectory.

Every route but `/health` and this spec needs `Authorization: Bearer <token>`. Errors always have the
`ErrorBody` shape; bad input answers 4xx. Environment failures are reported in results, not as errors.
"""

SessionId = Annotated[
    str, Path(min_length=1, max_length=64, description="Session id from POST /v1/sessions.")
]
IdemKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=256,
        description=(
            "Client-chosen unique key: a retried request with the same key returns the first result instead of "
            "running again (tools never run twice)."
        ),
    ),
]


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    text = {
        400: "The body could not be parsed.",
        401: "Missing or wrong bearer token.",
        403: "Not allowed by the server's configuration.",
        404: "No such session, environment or task.",
        409: "Conflicts with the session's state.",
        413: "Request body too large.",
        422: "Invalid request (see `detail`).",
        429: "A limit was reached; retry after `Retry-After` seconds.",
        503: "The server is shutting down.",
    }
    return {
        c: {"model": ErrorBody, "description": text[c], "content": {"application/json": {}}} for c in codes
    }


def _client(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def create_app(config: ServerConfig, token: str | None = None) -> FastAPI:
    """The application serving ``config.envs``; ``token`` is required when ``config.auth`` is on."""
    if config.auth and not token:
        raise TokenError("auth is on but no token was given")
    catalog = EnvCatalog(config.envs, allow_task_payload=config.allow_task_payload)
    metrics = Metrics()
    manager = SessionManager(config, catalog, metrics)
    rollouts = RolloutService(config, catalog, metrics)
    app = FastAPI(
        title="agentrl environment server",
        version=__version__,
        description=DESCRIPTION,
        lifespan=_lifespan(config, catalog, manager),
    )
    app.state.config, app.state.manager, app.state.catalog, app.state.metrics = (
        config,
        manager,
        catalog,
        metrics,
    )
    install_error_handlers(app)
    auth = [Depends(make_auth(token if config.auth else None))]
    _add_server_routes(app, auth, manager, catalog, metrics)
    _add_env_routes(app, auth, catalog)
    _add_session_routes(app, auth, manager)
    _add_rollout_routes(app, auth, rollouts)
    _add_openenv_routes(app, auth, config, token, manager, catalog)
    _add_middleware(app, config, token, metrics)
    return app


def _lifespan(
    config: ServerConfig, catalog: EnvCatalog, manager: SessionManager
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """The server's lifespan: old sandboxes collected and the environments' runs set up before the first
    session; sessions, runs and this server's sandboxes ended at shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if config.sandbox_gc:
            await _sandbox_gc(owner=None)
        started = await _setup_runs(catalog, config.owner or "env-server")
        manager.start()
        heap.freeze_heap()
        try:
            yield
        finally:
            await manager.shutdown()
            await _teardown_runs(started)
            if config.sandbox_gc and config.owner and "agentrl.sandbox.docker_sandbox" in sys.modules:
                await _sandbox_gc(owner=config.owner)

    return lifespan


def _add_server_routes(
    app: FastAPI, auth: list[Any], manager: SessionManager, catalog: EnvCatalog, metrics: Metrics
) -> None:
    """``/health`` and ``/metrics``: the server's own state."""

    @app.get("/health", response_model=Health, tags=["server"])
    async def health() -> Health:
        """Liveness (no token needed)."""
        return Health(sessions=len(manager.sessions), envs=catalog.names, version=__version__)

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        dependencies=auth,
        responses=_errors(401),
        tags=["server"],
    )
    async def prometheus() -> PlainTextResponse:
        """Counters, gauges and latency histograms in the Prometheus text format."""
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


def _add_env_routes(app: FastAPI, auth: list[Any], catalog: EnvCatalog) -> None:
    """``/v1/envs``: the environments served and their datasets."""

    @app.get(
        "/v1/envs", response_model=EnvList, dependencies=auth, responses=_errors(401), tags=["environments"]
    )
    async def list_envs() -> EnvList:
        """The environments served, with their tool schemas and limits."""
        return EnvList(envs=[catalog.info(n) for n in catalog.names])

    @app.get(
        "/v1/envs/{env}/tasks",
        response_model=TaskList,
        dependencies=auth,
        responses=_errors(401, 404, 422),
        tags=["environments"],
    )
    async def list_tasks(
        env: Annotated[str, Path(min_length=1, max_length=256, description="Environment name.")],
        split: Annotated[
            str,
            Query(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$", description="Dataset split."),
        ] = "train",
        offset: Annotated[int, Query(ge=0, le=10_000_000, description="First task to return.")] = 0,
        limit: Annotated[int, Query(ge=1, le=1000, description="Tasks per page.")] = 100,
    ) -> TaskList:
        """One page of an environment's built-in dataset."""
        name, _ = catalog.resolve(env)
        tasks = await asyncio.to_thread(catalog.dataset, name, split)
        return TaskList(
            env=name, split=split, total=len(tasks), offset=offset, tasks=tasks[offset : offset + limit]
        )


def _add_session_routes(app: FastAPI, auth: list[Any], manager: SessionManager) -> None:
    """``/v1/sessions``: open a session, step it, score it, read its state and close it."""

    @app.post(
        "/v1/sessions",
        response_model=SessionCreated,
        status_code=201,
        dependencies=auth,
        responses=_errors(400, 401, 403, 404, 413, 422, 429, 503),
        tags=["sessions"],
    )
    async def create_session(body: CreateSession, request: Request, key: IdemKey = None) -> SessionCreated:
        """Open a session: the environment is reset on the task; returns the opening messages and tools.

        A failing ``reset`` answers 422 with ``error: env_error``."""
        return await manager.create(body, _client(request), key)

    @app.get(
        "/v1/sessions/{session_id}",
        response_model=SessionState,
        dependencies=auth,
        responses=_errors(401, 404, 422),
        tags=["sessions"],
    )
    async def get_session(session_id: SessionId) -> SessionState:
        """The session's state: turns, whether it is over, its reward, and the transcript."""
        session = manager.get(session_id)
        session.touch()
        return session.state()

    @app.post(
        "/v1/sessions/{session_id}/step",
        response_model=StepResult,
        dependencies=auth,
        responses=_errors(400, 401, 404, 409, 413, 422),
        tags=["sessions"],
    )
    async def step(session_id: SessionId, body: StepRequest, key: IdemKey = None) -> StepResult:
        """Send the assistant's turn; its tool calls run in order and come back as observations.

        A turn without tool calls is the final answer: the episode ends and is scored. Tool failures are
        observations (``error`` says which kind), not HTTP errors."""
        return await manager.get(session_id).step(body, key)

    @app.post(
        "/v1/sessions/{session_id}/reward",
        response_model=RewardResult,
        dependencies=auth,
        responses=_errors(400, 401, 404, 413, 422),
        tags=["sessions"],
    )
    async def reward(
        session_id: SessionId, body: Annotated[RewardRequest | None, Body()] = None
    ) -> RewardResult:
        """End the episode if it is not over, and return its reward (computed once per session)."""
        return await manager.get(session_id).score(body or RewardRequest())

    @app.delete(
        "/v1/sessions/{session_id}",
        response_model=Closed,
        dependencies=auth,
        responses=_errors(401, 404, 422),
        tags=["sessions"],
    )
    async def close_session(session_id: SessionId) -> Closed:
        """Close the session and release its resources (sandboxes, files)."""
        manager.get(session_id)
        await manager.close(session_id, "client")
        return Closed(session_id=session_id)


def _add_rollout_routes(app: FastAPI, auth: list[Any], rollouts: RolloutService) -> None:
    """``/v1/rollouts``: whole episodes run here against the caller's inference server."""

    @app.post(
        "/v1/rollouts",
        response_model=RolloutResult,
        dependencies=auth,
        responses=_errors(400, 401, 403, 404, 409, 413, 422, 429),
        tags=["rollouts"],
    )
    async def rollout(body: RolloutRequest) -> RolloutResult:
        """Run a whole episode here, sampling from the caller's inference server; returns the trajectory
        with its token data. Inference or environment failures end the episode with a failed
        ``stop_reason`` and an ``error``; they are not HTTP errors."""
        return await rollouts.run(body)


def _add_openenv_routes(
    app: FastAPI,
    auth: list[Any],
    config: ServerConfig,
    token: str | None,
    manager: SessionManager,
    catalog: EnvCatalog,
) -> None:
    """``/v1/openenv/clients`` (capability URLs), then the OpenEnv and MCP routes under them (capabilities
    are signed with ``token`` when ``config.auth`` is on)."""

    @app.post(
        "/v1/openenv/clients", dependencies=auth, responses=_errors(400, 401, 413, 422), tags=["openenv"]
    )
    async def openenv_client(
        request: Request,
        client: Annotated[str, Body(embed=True, pattern=CLIENT_PATTERN, description="Client name.")],
    ) -> dict[str, str]:
        """The capability URL of an OpenEnv or MCP client named ``client``: the base URL to give a stock
        ``openenv-core`` client (its ``/ws``, ``/mcp``, ``/reset``, ... are under it)."""
        return {"client": client, "url": capability_url(str(request.base_url), token if config.auth else None,
                                                        client)}

    openenv = OpenEnvSessions(manager, catalog)
    app.include_router(openenv_router(openenv, token if config.auth else None))
    app.include_router(mcp_router(openenv, token if config.auth else None))


def _add_middleware(app: FastAPI, config: ServerConfig, token: str | None, metrics: Metrics) -> None:
    """The body limit, the bearer check (when auth is on) and the request metrics, in that order."""
    app.add_middleware(BodyLimit, max_bytes=config.max_request_bytes)
    if config.auth:
        assert token is not None
        app.add_middleware(BearerAuth, token=token)
    app.add_middleware(RequestMetrics, metrics=metrics)


async def _setup_runs(catalog: EnvCatalog, run_id: str) -> list[type[Any]]:
    """Call each served environment's ``setup_run(run_id)`` hook (shared resources such as a sandbox pool)
    once, before the first session; a failure stops the start-up (after tearing down those started)."""
    started: list[type[Any]] = []
    for cls in catalog.classes.values():
        hook = getattr(cls, "setup_run", None)
        if hook is None:
            continue
        try:
            await hook(run_id)
        except BaseException:
            await _teardown_runs(started)
            raise
        started.append(cls)
    return started


async def _teardown_runs(classes: list[type[Any]]) -> None:
    """Call ``teardown_run`` of each class whose ``setup_run`` ran (bounded; failures are logged)."""
    for cls in reversed(classes):
        try:
            await asyncio.wait_for(cls.teardown_run(), timeout=120)
        except Exception as e:
            log.warning("teardown_run of %s failed: %s: %s", cls.__name__, type(e).__name__, e)


async def _sandbox_gc(owner: str | None) -> None:
    """Remove sandbox containers of dead drivers (``owner=None``) or of ``owner``; best effort, bounded."""

    def run() -> list[str]:
        from agentrl.sandbox import cleanup_on_start, gc

        return cleanup_on_start() if owner is None else gc(owner=owner, all_dead=False, expired=False)

    try:
        removed = await asyncio.wait_for(asyncio.to_thread(run), timeout=60)
    except Exception as e:  # no engine, slow engine: containers still expire by themselves
        log.warning("sandbox cleanup skipped: %s: %s", type(e).__name__, e)
        return
    if removed:
        log.info(
            "removed %d sandbox container(s) %s",
            len(removed),
            "left by dead servers" if owner is None else f"of this server ({owner})",
        )
