"""The wire side of the inference client: errors, the ``Generation`` record, and response parsing.

Parses vLLM 0.32's ``/inference/v1/generate`` (tokens mode) and ``/v1/completions`` (with
``return_token_ids``) answers; maps HTTP errors onto retryable / non-retryable exceptions.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from agentrl.core.errors import EngineError
from agentrl.core.masks import SamplingMask, SamplingMaskError

_CONTEXT_RE = re.compile(r"maximum (model|context) length", re.IGNORECASE)
"""vLLM's text for a prompt longer than ``max_model_len``: vLLM gives it no code of its own (the error type
is the generic ``BadRequestError``), so this one engine failure is still recognised by its wording."""
VLLM_NOT_FOUND = "NotFoundError"
"""vLLM's error ``type`` for an unknown name (e.g. unloading an adapter it does not hold)."""
VLLM_PERMISSION_DENIED = "PermissionDeniedError"
"""vLLM's error ``type`` of a 403 from a route it serves but has disabled (the scale-out routes)."""


class InferenceError(EngineError):
    """A request failed (after retries for transient errors; at once for 4xx answers). ``engine_code``: the
    engine's own error type from the answer (vLLM's ``error.type``, e.g. :data:`VLLM_NOT_FOUND`), if any."""

    code = "inference.request_failed"

    def __init__(self, message: str, *, endpoint: str | None = None, status_code: int | None = None,
                 engine_code: str | None = None) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.status_code = status_code
        self.engine_code = engine_code


class ContextLengthError(InferenceError):
    """The prompt does not fit the engine's ``max_model_len``."""

    code = "inference.context_length"


class RouteUnavailable(InferenceError):
    """The endpoint does not serve this route (404/405 from the router, or 403 'scale-out disabled')."""

    code = "inference.route_unavailable"


class NoEnginesError(InferenceError, RuntimeError):
    """Every endpoint is out of rotation (dead, hung, or failed a broadcast). Raised by the client and by
    :meth:`agentrl.inference.routing.EndpointPool.pick` (a ``RuntimeError`` too, as the pool's error was)."""

    code = "inference.no_engines"


class InvalidArgument(EngineError, ValueError):
    """A call of the inference client (or a helper of it) was given an argument it cannot send: an empty
    prompt, an unknown pause mode, a URL that is not one of the client's endpoints."""

    code = "inference.invalid_argument"


class MalformedAnswer(EngineError, ValueError):
    """Part of an engine's answer cannot be read as what it should hold (e.g. ``routed_experts`` of another
    shape); the parser reports it as an :class:`InferenceError` naming the source."""

    code = "inference.malformed_answer"


class TransientError(EngineError):
    """Retryable: connection error, timeout, or a 5xx answer. ``refused``: nothing accepted the connection
    (the server is not running), as opposed to a dropped connection, a timeout or an error answer."""

    code = "inference.transient"

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


@dataclass
class Generation:
    """One sampled completion, in token ids."""

    token_ids: list[int]
    logprobs: list[float]
    """Logprob of each sampled token, as the engine reports it: of the distribution it sampled from when
    it runs with ``--logprobs-mode processed_logprobs`` (agentrl's servers do), else at temperature 1."""
    finish_reason: str
    """"stop" (EOS / stop token, which ends ``token_ids``), "length", or "abort" (e.g. ``pause(mode="abort")``)."""
    weight_versions: list[tuple[str | None, int, int]] | None
    """(weight label, start, end) spans over output-token indexes (label None: the engine had none);
    None on the completions fallback. :func:`agentrl.core.versions.token_versions` reads them."""
    endpoint: str
    routing: RoutingRows | None = None
    """MoE routing of the request's positions (when asked for with ``routing_from``), else None."""
    top_logprobs: list[dict[int, float]] | None = None
    """Per sampled token, the most likely ids and their logprobs (when asked for with ``top_logprobs``)."""
    sampling_mask: SamplingMask | None = None
    """Per sampled token, the set the engine's truncated distribution kept (when asked for with
    ``sampling_mask``), else None."""


@dataclass
class RoutingRows:
    """Expert routing of positions ``start .. start + len(rows) - 1`` of a request's prompt + output tokens
    (``rows``: numpy ``[m, layers, top_k]``, uint8 or uint16). It ends one position before the last output
    token, which was never fed forward."""

    start: int
    rows: Any


def routing_rows(rec: dict[str, Any]) -> RoutingRows:
    """A worker's ``agentrl_routing_take`` record (:mod:`agentrl.engine.routing`) as rows."""
    import base64

    import numpy as np

    rows = np.frombuffer(base64.b64decode(rec["data"]), dtype=rec["dtype"]).reshape(rec["shape"])
    return RoutingRows(int(rec["start"]), rows)


def sampling_mask_of(rec: dict[str, Any], n: int, url: str) -> SamplingMask:
    """A worker's ``agentrl_masks_take`` record (:mod:`agentrl.engine.masks`) for a completion of ``n``
    tokens (an :class:`InferenceError` when it does not cover them)."""
    import base64

    mask = SamplingMask(vocab=int(rec["vocab"]))
    try:
        mask.extend([int(c) for c in rec["counts"]], base64.b64decode(rec["data"]))
        mask.check(n)
    except (SamplingMaskError, ValueError) as e:  # ValueError: counts or base64 that do not parse
        raise InferenceError(f"{url}: the engine's sampling masks do not fit the completion: {e}",
                             endpoint=url) from None
    return mask


def native_routing(b64: str) -> RoutingRows:
    """vLLM's own ``routed_experts`` (base64 of an ``.npy`` array over positions 0 ..) as rows from 0."""
    import base64
    import io

    import numpy as np

    arr = np.load(io.BytesIO(base64.b64decode(b64)), allow_pickle=False)
    if arr.ndim != 3:
        raise MalformedAnswer(f"routed_experts has shape {arr.shape}, expected [positions, layers, top_k]")
    return RoutingRows(0, arr.astype(np.uint8 if int(arr.max(initial=0)) < 256 else np.uint16, copy=False))


def server_message(r: httpx.Response) -> str:
    """The error message in a vLLM / FastAPI error body (or the raw text)."""
    try:
        body = r.json()
    except ValueError:
        return r.text[:500]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if err is not None:
            return str(err)
        if "detail" in body:
            return str(body["detail"])
    return str(body)[:500]


def server_error_type(r: httpx.Response) -> str | None:
    """vLLM's machine-readable error type (``{"error": {"type": ...}}``) of an error answer, if it has one."""
    try:
        body = r.json()
    except ValueError:
        return None
    err = body.get("error") if isinstance(body, dict) else None
    kind = err.get("type") if isinstance(err, dict) else None
    return kind if isinstance(kind, str) else None


def check_response(r: httpx.Response, where: str) -> httpx.Response:
    """Return a 2xx response; raise ``TransientError`` for 5xx, an ``InferenceError`` for 4xx."""
    if r.status_code < 400:
        return r
    msg = server_message(r)
    if r.status_code >= 500:
        raise TransientError(f"HTTP {r.status_code}: {msg}")
    text = f"{where} answered HTTP {r.status_code}: {msg}"
    kind = server_error_type(r)
    # a route the server lacks: the router's own 404/405 (no vLLM error type), or vLLM's 403 for a disabled one
    if (r.status_code in (404, 405) and kind is None and msg in ("Not Found", "Method Not Allowed")) or (
        r.status_code == 403 and kind == VLLM_PERMISSION_DENIED
    ):
        raise RouteUnavailable(text, endpoint=where, status_code=r.status_code, engine_code=kind)
    if r.status_code == 400 and _CONTEXT_RE.search(msg):
        raise ContextLengthError(text, endpoint=where, status_code=400, engine_code=kind)
    raise InferenceError(text, endpoint=where, status_code=r.status_code, engine_code=kind)


def parse_generate(body: dict[str, Any], url: str) -> Generation:
    """A ``/inference/v1/generate`` tokens-mode answer (first choice) as a ``Generation``."""
    ch = body["choices"][0]
    content = (ch.get("logprobs") or {}).get("content") or []
    spans = ch.get("weight_versions")
    return Generation(
        token_ids=list(ch["token_ids"]),
        logprobs=[float(c["logprob"]) for c in content],
        finish_reason=ch.get("finish_reason") or "stop",
        weight_versions=[(None if s.get("version") is None else str(s["version"]), int(s["start"]), int(s["end"]))
                         for s in spans] if spans else None,
        endpoint=url,
        routing=native_routing(ch["routed_experts"]) if ch.get("routed_experts") else None,
        top_logprobs=[{int(t["token_id"]): float(t["logprob"]) for t in c["top_logprobs"]} for c in content]
        if content and content[0].get("top_logprobs") else None,
    )


def parse_completions(body: dict[str, Any], url: str) -> Generation:
    """A ``/v1/completions`` answer with ``return_token_ids`` (first choice) as a ``Generation``."""
    ch = body["choices"][0]
    lps = (ch.get("logprobs") or {}).get("token_logprobs") or []
    tops = (ch.get("logprobs") or {}).get("top_logprobs") or []
    return Generation(
        token_ids=list(ch["token_ids"] or []),
        logprobs=[float(x) if x is not None else float("-inf") for x in lps],
        finish_reason=ch.get("finish_reason") or "stop",
        weight_versions=None,
        endpoint=url,
        top_logprobs=[{_token_id(k): float(v) for k, v in (c or {}).items()} for c in tops] if any(tops) else None,
    )


def _token_id(token: str) -> int:
    """The id of a ``token_id:N`` token (vLLM's ``return_tokens_as_token_ids``)."""
    return int(token.rpartition(":")[2])


def parse_body(parse: Any, r: httpx.Response, url: str) -> Generation:
    """Apply ``parse`` to ``r``'s JSON; a malformed body becomes an ``InferenceError``."""
    return parse_json(parse, r.json, url, str(r.request.url), r.text[:300])


def parse_json(parse: Any, load: Callable[[], Any], url: str, source: str, excerpt: str = "") -> Generation:
    """Apply ``parse`` to the JSON ``load()`` returns (``source`` sent it: a response, or a stream that
    assembled it); a malformed body becomes an ``InferenceError`` naming ``source``, with ``excerpt``."""
    try:
        return parse(load(), url)
    except (MalformedAnswer, ValueError, KeyError, IndexError, TypeError) as e:  # builtins: JSON of another shape
        raise InferenceError(f"{source} returned an unexpected body ({type(e).__name__}: {e})"
                             + (f": {excerpt}" if excerpt else ""), endpoint=url) from e
