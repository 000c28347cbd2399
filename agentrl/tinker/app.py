"""The HTTP routes of ``agentrl serve-tinker``: the ``/api/v1/...`` REST surface of the tinker SDK 0.38.
JSON bodies are validated with the SDK's own request types; ``forward_backward`` takes a protobuf body
(zstd-compressed when the client says so); results are polled with ``retrieve_future``. Every failure
answers one JSON shape (``{"error", "message", "category"}``) with a 4xx status for a bad request, and the
server goes on serving everyone else."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from agentrl.tinker.errors import TinkerError, TinkerUserError
from agentrl.tinker.futures import Future
from agentrl.tinker.keys import Keys
from agentrl.tinker.sampling import Sampling
from agentrl.tinker.service import TinkerService

log = logging.getLogger(__name__)
PROTO = "application/x-protobuf"
MAX_BODY = 512 * 1024 * 1024


def _types() -> Any:
    from tinker import types

    return types


async def _body(request: Request, model: Any) -> Any:
    """The JSON body as the SDK's request type ``model``; a malformed one is a :class:`TinkerUserError`."""
    import pydantic

    raw = await request.body()
    try:
        return model.model_validate_json(raw or b"{}")
    except pydantic.ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, p['loc'])) or 'body'}: {p['msg']}" for p in e.errors()[:5])
        raise TinkerUserError(f"{request.url.path}: the body is not a {model.__name__} ({problems})") from e


def _future(fut: Future) -> dict[str, Any]:
    return {"request_id": fut.request_id, **fut.extra}


async def _proto_body(request: Request) -> bytes:
    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise TinkerUserError(f"the body is larger than {MAX_BODY} bytes")
    if request.headers.get("content-encoding", "").lower() == "zstd":
        import zstandard

        try:
            raw = zstandard.ZstdDecompressor().decompress(raw, max_output_size=MAX_BODY)
        except zstandard.ZstdError as e:
            raise TinkerUserError(f"the body is not valid zstd ({e})") from e
    return raw


def _int_param(request: Request, name: str, default: int) -> int:
    """Query parameter ``name`` as an int; anything else is a :class:`TinkerUserError`."""
    raw = request.query_params.get(name)
    try:
        return default if raw is None else int(raw)
    except ValueError as e:
        raise TinkerUserError(f"{request.url.path}: {name}={raw!r} is not an integer") from e


def _listing_params(request: Request) -> None:
    """Refuse what a listing cannot honour: an ``access_scope`` other than ``owned``/``accessible`` (both mean the
    key's own here; nothing is shared) and a ``project_id`` (this server has no projects)."""
    scope = request.query_params.get("access_scope", "owned")
    if scope not in ("owned", "accessible"):
        raise TinkerUserError(f"access_scope {scope!r}: 'owned' or 'accessible'")
    if request.query_params.get("project_id"):
        raise TinkerUserError("project_id: this server has no projects; list without it")


def _settled(fut: Future) -> Response:
    if fut.error is not None:
        return JSONResponse({"error": fut.error, "category": fut.category})
    if fut.proto is not None:
        return Response(fut.proto, media_type=PROTO)
    return JSONResponse(fut.json or {})


def client_config() -> dict[str, Any]:
    """The feature flags this server answers ``/api/v1/client/config`` with: httpx transport, parallel
    forward/backward chunks, plain (uncompressed) bodies, custom losses client-side, per-request polling."""
    return {"pjwt_auth_enabled": False, "credential_default_source": "api_key", "use_pyqwest_transport": False,
            "parallel_fwdbwd_chunks": True, "proto_compress_fwdbwd": False, "sample_use_retrieve_futures": False,
            "custom_loss_server_side": False, "sample_join_sampling_session": False}


def build_app(svc: TinkerService, sampling: Sampling, keys: Keys, *, session_ttl_s: float = 600.0) -> FastAPI:
    """The app over ``svc`` (training), ``sampling`` and the accepted ``keys``; a session without a heartbeat
    for ``session_ttl_s`` is finished and its adapters freed."""

    async def reaper() -> None:
        while True:
            await asyncio.sleep(min(30.0, session_ttl_s / 4))
            try:
                await svc.expire(session_ttl_s)
            except Exception:  # the reaper must outlive one bad round
                log.exception("expiring sessions failed")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(reaper(), name="tinker-session-reaper")
        try:
            yield
        finally:
            task.cancel()
            await sampling.close()

    app = FastAPI(title="agentrl serve-tinker", lifespan=lifespan, docs_url=None, redoc_url=None)

    @app.exception_handler(TinkerError)
    async def tinker_error(request: Request, e: TinkerError) -> JSONResponse:
        if e.status >= 500:
            log.error("%s: %s", request.url.path, e)
        return JSONResponse({"error": e.code, "message": str(e), "detail": str(e), "category": e.category},
                            status_code=e.status)

    def owner(request: Request) -> str:
        return keys.owner(request.headers.get("x-api-key"))

    _service_routes(app, svc, sampling, owner)
    _training_routes(app, svc, sampling, owner)
    _run_routes(app, svc, owner)
    return app


def _service_routes(app: FastAPI, svc: TinkerService, sampling: Sampling, owner: Any) -> None:
    t = _types()

    @app.get("/api/v1/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/api/v1/client/config")
    async def config(request: Request) -> dict[str, Any]:
        owner(request)
        return client_config()

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config(request: Request) -> dict[str, Any]:
        owner(request)
        return {"refresh_interval_sec": 300, "sample_cancel_enabled": False}

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities(request: Request) -> dict[str, Any]:
        owner(request)
        return {"supported_models": [{"model_name": svc.model_name, "max_context_length": svc.max_context,
                                      "trainable": True, "sampleable": True}]}

    @app.post("/api/v1/telemetry")
    async def telemetry(request: Request) -> dict[str, str]:
        owner(request)
        return {"status": "accepted"}

    @app.post("/api/v1/create_session")
    async def create_session(request: Request) -> dict[str, Any]:
        who = owner(request)
        await _body(request, t.CreateSessionRequest)
        return {"type": "create_session", "session_id": svc.create_session(who)}

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(request: Request) -> dict[str, Any]:
        who = owner(request)
        req = await _body(request, t.SessionHeartbeatRequest)
        svc.heartbeat(who, req.session_id)
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str, request: Request) -> dict[str, Any]:
        who = owner(request)
        try:
            status = str(((await request.json()) or {}).get("reason", {}).get("type", "success"))
        except (ValueError, AttributeError):
            status = "success"
        await svc.finish(who, session_id, status)
        return {}

    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request) -> Response:
        who = owner(request)
        req = await _body(request, t.FutureRetrieveRequest)
        fut = await svc.futures.wait(req.request_id, who)
        if fut is None:
            return JSONResponse({"type": "try_again", "request_id": req.request_id, "queue_state": "active"})
        return _settled(fut)

    @app.post("/api/v1/cancel_future")
    async def cancel_future(request: Request) -> dict[str, Any]:
        owner(request)
        return {}


def _training_routes(app: FastAPI, svc: TinkerService, sampling: Sampling, owner: Any) -> None:
    t = _types()

    @app.post("/api/v1/create_model")
    async def create_model(request: Request) -> dict[str, Any]:
        who = owner(request)
        return _future(svc.create_model(who, await _body(request, t.CreateModelRequest)))

    @app.post("/api/v1/get_info")
    async def get_info(request: Request) -> dict[str, Any]:
        who = owner(request)
        return svc.get_info(who, (await _body(request, t.GetInfoRequest)).model_id)

    @app.post("/api/v1/unload_model")
    async def unload_model(request: Request) -> dict[str, Any]:
        who = owner(request)
        return _future(svc.unload_model(who, (await _body(request, t.UnloadModelRequest)).model_id))

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request) -> dict[str, Any]:
        who = owner(request)
        return _future(svc.forward_backward(who, await _proto_body(request)))

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request) -> dict[str, Any]:
        who = owner(request)
        return _future(svc.optim_step(who, await _body(request, t.OptimStepRequest)))

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request) -> dict[str, Any]:
        who = owner(request)
        return _future(svc.save_weights(who, await _body(request, t.SaveWeightsRequest)))

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request) -> dict[str, Any]:
        who = owner(request)
        return _future(svc.load_weights(who, await _body(request, t.LoadWeightsRequest)))

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(request: Request) -> dict[str, Any]:
        who = owner(request)
        return _future(sampling.save_weights_for_sampler(who, await _body(request, t.SaveWeightsForSamplerRequest)))

    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request) -> dict[str, Any]:
        who = owner(request)
        sid = sampling.create_sampling_session(who, await _body(request, t.CreateSamplingSessionRequest))
        return {"type": "create_sampling_session", "sampling_session_id": sid}

    @app.get("/api/v1/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str, request: Request) -> dict[str, Any]:
        return sampling.get_sampler(owner(request), sampler_id)

    @app.post("/api/v1/asample")
    async def asample(request: Request) -> dict[str, Any]:
        who = owner(request)
        return _future(sampling.asample(who, await _body(request, t.SampleRequest)))


def _run_routes(app: FastAPI, svc: TinkerService, owner: Any) -> None:
    """The REST client's listings: training runs and their checkpoints (:mod:`agentrl.tinker.runs`)."""

    @app.get("/api/v1/training_runs")
    async def list_training_runs(request: Request) -> dict[str, Any]:
        who = owner(request)
        _listing_params(request)
        return svc.runs.page(who, _int_param(request, "limit", 20), _int_param(request, "offset", 0),
                             svc.last_requests(who))

    @app.get("/api/v1/training_runs/{run_id}")
    async def get_training_run(run_id: str, request: Request) -> dict[str, Any]:
        who = owner(request)
        _listing_params(request)
        return svc.training_run(who, run_id)

    @app.get("/api/v1/training_runs/{run_id}/checkpoints")
    async def list_checkpoints(run_id: str, request: Request) -> dict[str, Any]:
        return svc.runs.list_checkpoints(owner(request), run_id)

    @app.delete("/api/v1/training_runs/{run_id}/checkpoints/{checkpoint_id:path}")
    async def delete_checkpoint(run_id: str, checkpoint_id: str, request: Request) -> dict[str, Any]:
        svc.runs.delete(owner(request), run_id, checkpoint_id)
        return {}

    @app.get("/api/v1/checkpoints")
    async def list_user_checkpoints(request: Request) -> dict[str, Any]:
        who = owner(request)
        return svc.runs.user_checkpoints(who, _int_param(request, "limit", 100), _int_param(request, "offset", 0))
