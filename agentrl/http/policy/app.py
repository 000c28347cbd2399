"""The FastAPI application of the policy endpoint: the OpenAI chat routes and the episode routes.

Credentials: ``Authorization: Bearer <key>`` where the key is the server's token (creating episodes;
any route) or an episode's ``api_key`` (its own calls, reward and trajectory). Chat calls made with an
episode's key are recorded in that episode; calls made with the server token are served and not recorded.
Errors have OpenAI's shape (``{"error": {"message", "type", "code", "param"}}``), so the ``openai`` SDK
shows their messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Request
from fastapi.responses import StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel, Field

from agentrl import __version__
from agentrl.http.auth import TokenError, bearer
from agentrl.http.errors import ApiError, install_error_handlers
from agentrl.http.limits import BodyLimit
from agentrl.http.policy.episodes import EpisodeBook, PolicyEpisode
from agentrl.http.policy.messages import ChatRequest
from agentrl.http.policy.responses import ResponsesRequest
from agentrl.http.policy.service import PolicyService
from agentrl.http.policy.stream import LiveTurn, response_events, sse_events

EpisodeId = Annotated[str, Path(min_length=1, max_length=64, description="Episode id from POST /v1/episodes.")]


class CreateEpisode(BaseModel):
    """Optional labels of a new episode (kept with its trajectory)."""

    task_id: str = Field("", max_length=256)
    group_id: str = Field("", max_length=256)
    meta: dict[str, Any] = Field(default_factory=dict)


class RewardBody(BaseModel):
    """The episode's reward; posting it ends the episode."""

    reward: float

    def finite(self) -> float:
        if not math.isfinite(self.reward):
            raise ApiError(422, f"reward must be a finite number, not {self.reward}")
        return self.reward


@dataclass
class Caller:
    """Who is calling: the server (its token) or one episode (its key)."""

    admin: bool
    episode: PolicyEpisode | None = None


CallerDependency = Callable[..., Awaitable[Caller]]
"""A FastAPI dependency naming the caller (see :func:`_credentials`)."""


def create_app(service: PolicyService, token: str, public_url: str | None = None) -> FastAPI:
    """The application over ``service``; ``token`` creates episodes; ``public_url`` is the base of the
    ``base_url`` handed to agents (default: the URL the creating request reached)."""
    if not token:
        raise TokenError("the policy endpoint needs a token")
    expected = token.encode()
    book = service.book
    caller, admin = _credentials(book, expected)
    app = FastAPI(title="agentrl policy endpoint", version=__version__, lifespan=_lifespan(book),
                  description=__doc__)
    app.state.service = service
    install_error_handlers(app, openai=True)
    app.add_middleware(BodyLimit, max_bytes=service.config.max_request_bytes)
    _add_health_route(app, service, book)
    _add_openai_routes(app, service, caller)
    _add_episode_routes(app, book, expected, caller, admin, public_url)
    return app


def _credentials(book: EpisodeBook, expected: bytes) -> tuple[CallerDependency, CallerDependency]:
    """The dependencies ``caller`` (who is calling: the server, whose token is ``expected``, or one episode
    of ``book``) and ``admin`` (the server only)."""

    async def caller(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> Caller:
        if credentials is None:
            raise ApiError(401, "missing API key: send 'Authorization: Bearer <api_key>'",
                           headers={"WWW-Authenticate": "Bearer"})
        key = credentials.credentials
        if hmac.compare_digest(key.encode("utf-8", "replace"), expected):
            return Caller(admin=True)
        return Caller(admin=False, episode=book.by_key(key))

    async def admin(who: Caller = Depends(caller)) -> Caller:
        if not who.admin:
            raise ApiError(403, "creating episodes needs the server's token, not an episode's key")
        return who

    return caller, admin


def _owned(book: EpisodeBook, who: Caller, episode_id: str) -> PolicyEpisode:
    """Episode ``episode_id`` of ``book``, when ``who`` may reach it (the server: any; an episode: its own)."""
    if who.admin:
        return book.get(episode_id)
    assert who.episode is not None
    if who.episode.id != episode_id:
        raise ApiError(403, "an episode's key only reaches its own episode")
    return who.episode


def _lifespan(book: EpisodeBook) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """The endpoint's lifespan: a task ends the episodes of ``book`` whose time to live ran out."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        async def sweep() -> None:
            while True:
                await asyncio.sleep(min(book.next_deadline_s(), 5.0))
                book.sweep()

        task = asyncio.create_task(sweep(), name="policy-episode-ttl")
        try:
            yield
        finally:
            task.cancel()

    return lifespan


def _add_health_route(app: FastAPI, service: PolicyService, book: EpisodeBook) -> None:
    """``/health``: liveness, open episodes and calls served."""

    @app.get("/health", tags=["server"])
    async def health() -> dict[str, Any]:
        """Liveness (no key needed)."""
        return {"status": "ok", "open_episodes": book.open_count, "calls": service.calls, "version": __version__}


def _add_openai_routes(app: FastAPI, service: PolicyService, caller: CallerDependency) -> None:
    """The OpenAI routes: ``/v1/models``, ``/v1/chat/completions`` and ``/v1/responses``."""

    @app.get("/v1/models", tags=["openai"])
    async def models(_who: Caller = Depends(caller)) -> dict[str, Any]:
        """The served policy, as one model."""
        return {"object": "list", "data": [{"id": service.config.served_model, "object": "model",
                                            "created": 0, "owned_by": "agentrl"}]}

    @app.post("/v1/chat/completions", tags=["openai"], response_model=None)
    async def chat_completions(body: ChatRequest, who: Caller = Depends(caller)) -> dict[str, Any] | StreamingResponse:
        """An OpenAI chat completion (streamed as server-sent events with ``stream=true``); recorded in the
        caller's episode."""
        usage = bool((body.stream_options or {}).get("include_usage"))
        markers = service.live_markers(body) if body.stream else None
        if markers is None:
            completion = await service.complete(body, who.episode)
            if not body.stream:
                return completion
            return StreamingResponse(sse_events(completion, usage), media_type="text/event-stream")
        turn = LiveTurn(service.chat.decode, markers, body.model or service.config.served_model)
        # the call runs in a task of its own: a client that goes away mid-stream leaves it to finish and be recorded
        task = service.keep(asyncio.ensure_future(service.complete(body, who.episode, on_tokens=turn.push)))
        await turn.opened(task)
        return StreamingResponse(turn.events(task, usage), media_type="text/event-stream")

    @app.post("/v1/responses", tags=["openai"], response_model=None)
    async def responses(body: ResponsesRequest, who: Caller = Depends(caller)) -> dict[str, Any] | StreamingResponse:
        """An OpenAI Responses API call (the subset agent frameworks use; streamed as events with
        ``stream=true``); recorded in the caller's episode as the same conversation in chat form."""
        response = await service.respond(body, who.episode)
        if not body.stream:
            return response
        return StreamingResponse(response_events(response), media_type="text/event-stream")


def _add_episode_routes(app: FastAPI, book: EpisodeBook, expected: bytes, caller: CallerDependency,
                        admin: CallerDependency, public_url: str | None) -> None:
    """The episode routes: create one (``admin``), post its reward, read its trajectory."""

    @app.post("/v1/episodes", status_code=201, tags=["episodes"])
    async def create_episode(request: Request, body: CreateEpisode | None = None,
                             _who: Caller = Depends(admin)) -> dict[str, Any]:
        """A new episode: give the agent its ``base_url`` and ``api_key``."""
        body = body or CreateEpisode()
        ep, key = book.create(task_id=body.task_id, group_id=body.group_id, meta=body.meta)
        base = (public_url or str(request.base_url)).rstrip("/")
        return {"episode_id": ep.id, "base_url": f"{base}/v1", "api_key": key}

    @app.post("/v1/episodes/{episode_id}/reward", tags=["episodes"])
    async def reward(episode_id: EpisodeId, body: RewardBody, who: Caller = Depends(caller)) -> dict[str, Any]:
        """End the episode with its reward (its key stops working)."""
        ep = _owned(book, who, episode_id)
        value = body.finite()
        async with ep.lock:  # after a call in flight is recorded
            if not ep.open:
                raise ApiError(409, f"episode {episode_id} is already over ({ep.status})")
            ep.last_seen = time.monotonic()
            book.finish(ep, "ended", reward=value)
        return {"episode_id": ep.id, "status": ep.status, "reward": ep.reward, "rows": len(ep.rows)}

    @app.get("/v1/episodes/{episode_id}/trajectory", tags=["episodes"])
    async def trajectory(episode_id: EpisodeId, request: Request) -> dict[str, Any]:
        """The episode's rows (readable with its key even after it ended)."""
        credentials = await bearer(request)
        if credentials is None:
            raise ApiError(401, "missing API key: send 'Authorization: Bearer <api_key>'",
                           headers={"WWW-Authenticate": "Bearer"})
        if hmac.compare_digest(credentials.credentials.encode("utf-8", "replace"), expected):
            ep = book.get(episode_id)
        else:
            ep = book.key_episode(credentials.credentials)
            if ep is None:
                raise ApiError(401, "invalid API key", headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
            if ep.id != episode_id:
                raise ApiError(403, "an episode's key only reaches its own episode")
        return ep.trajectory()
