"""Error answers: one JSON shape (``ErrorBody``) for every failure, 4xx for bad input, no stack traces."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentrl.core.errors import AgentRLError

log = logging.getLogger("agentrl.http.server")

_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "too_many_requests",
    503: "unavailable",
}


class ApiError(AgentRLError):
    """Raise in a route to answer ``status`` with an ``ErrorBody``. ``code`` (per instance): the answer's
    ``error`` field, by default the one of ``status`` (``not_found``, ...)."""

    code = "http.api_error"

    def __init__(
        self, status: int, message: str, *, code: str | None = None, headers: dict[str, str] | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code or _CODES.get(status, "error")
        self.message = message
        self.headers = headers
        self.param = param
        """The request parameter at fault (OpenAI's ``error.param``), if one is."""


def error_response(
    status: int,
    code: str,
    message: str,
    detail: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
    *,
    openai: bool = False,
    param: str | None = None,
) -> JSONResponse:
    """An ``ErrorBody`` JSON response; with ``openai``, OpenAI's error shape (``{"error": {"message",
    "type", "code", "param"}}``), which the ``openai`` SDK reads its messages from."""
    if openai:
        body: dict[str, Any] = {"error": {"message": message, "type": code, "code": code, "param": param},
                                "detail": detail}
    else:
        body = {"error": code, "message": message, "detail": detail}
    return JSONResponse(body, status_code=status, headers=headers)


def _clean(errors: list[Any]) -> list[dict[str, Any]]:
    """Validation errors without the offending input (which may be huge) or internal context."""
    out = []
    for e in errors[:20]:
        loc = [p if isinstance(p, (str, int)) else str(p) for p in e.get("loc", ())]
        out.append({"loc": loc, "msg": str(e.get("msg", ""))[:500], "type": str(e.get("type", ""))})
    return out


def install_error_handlers(app: FastAPI, *, openai: bool = False) -> None:
    """Map validation errors, HTTP errors, ``ApiError`` and anything unexpected onto ``ErrorBody`` (or, with
    ``openai``, onto OpenAI's error shape)."""

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, headers=exc.headers, openai=openai, param=exc.param)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        detail = _clean(list(exc.errors()))
        if any(d["type"] == "json_invalid" for d in detail):
            msg = "the request body is not valid JSON"
        else:
            msg = "; ".join(f"{'.'.join(str(p) for p in d['loc'])}: {d['msg']}" for d in detail[:5])
        return error_response(422, "invalid_request", msg or "invalid request", detail, openai=openai)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _CODES.get(exc.status_code, "error")
        return error_response(exc.status_code, code, str(exc.detail), headers=getattr(exc, "headers", None), openai=openai)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return error_response(500, "internal", "internal server error (logged on the server)", openai=openai)
