"""Async, token-faithful client for one or more vLLM servers.

Generation prefers vLLM's token-in/token-out route ``POST /inference/v1/generate`` (integer token ids
and logprobs, weight-version spans) and falls back to ``POST /v1/completions`` with a token-id prompt
when an endpoint does not serve it (detected once per endpoint). Special tokens are never skipped: a
generation ended by EOS or a stop token id has that id as its last token (and a logprob for it).
Routing: least outstanding requests (:mod:`agentrl.inference.routing`, which says why not tokens); a
``key`` (e.g. an episode id) keeps one episode on one endpoint so its growing prompt hits that engine's
prefix cache.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from agentrl.core.masks import SamplingMask
from agentrl.core.utils.race import unless_set
from agentrl.core.utils.retry import RetriesExhausted, Retry, RetryPolicy
from agentrl.core.utils.tls import tls_context
from agentrl.inference.routing import Endpoint, EndpointPool
from agentrl.inference.stream import OnTokens, stream_generate
from agentrl.inference.wire import (
    VLLM_NOT_FOUND,
    ContextLengthError,
    Generation,
    InferenceError,
    InvalidArgument,
    NoEnginesError,
    RouteUnavailable,
    RoutingRows,
    TransientError,
    check_response,
    parse_body,
    parse_completions,
    parse_generate,
    parse_json,
    routing_rows,
    sampling_mask_of,
)

__all__ = ["ContextLengthError", "EndpointPool", "EngineRefused", "Generation", "InferenceClient", "InferenceError",
           "NoEnginesError"]


class EngineRefused(InferenceError):
    """An admin call found nothing accepting connections at an endpoint, through every retry: its server
    is not running."""

    code = "inference.engine_refused"


log = logging.getLogger(__name__)
T = TypeVar("T")

_GENERATE = "/inference/v1/generate"
_COMPLETIONS = "/v1/completions"


def _pool_load(client: httpx.AsyncClient) -> int:
    """Requests queued or running in ``client``'s connection pool."""
    pool = getattr(client, "_transport", None)
    pool = getattr(pool, "_pool", None)
    return len(getattr(pool, "_requests", ()))


def _sampling_params(*, max_tokens: int, temperature: float, top_p: float, top_k: int, min_p: float,
                     top_logprobs: int, stop_token_ids: list[int] | None, seed: int | None,
                     ignore_eos: bool) -> dict[str, Any]:
    """Every sampling parameter of one generation, the penalties neutral (:meth:`InferenceClient.generate`)."""
    sp: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p,
                          "top_k": top_k if top_k > 0 else -1, "min_p": min_p, "repetition_penalty": 1.0,
                          "presence_penalty": 0.0, "frequency_penalty": 0.0, "logprobs": top_logprobs,
                          "skip_special_tokens": False, "stop_token_ids": list(stop_token_ids or [])}
    if seed is not None:
        sp["seed"] = seed
    if ignore_eos:  # fixed-length generations (benchmarks, tests)
        sp["ignore_eos"] = True
    return sp


def _request_bodies(model: str, prompt_ids: list[int], sp: dict[str, Any],
                    cache_salt: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """One generation's request as the token route's body and as the ``/v1/completions`` fallback's."""
    gen_body: dict[str, Any] = {"model": model, "token_ids": list(prompt_ids),
                                "sampling_params": {**sp, "detokenize": False}}
    # the completions route lists each sampled token among its alternatives (even at logprobs=0): named by
    # id, never by text, so the answer parses whether or not alternatives were asked for
    cmpl_body: dict[str, Any] = {"model": model, "prompt": list(prompt_ids), "return_token_ids": True,
                                 "return_tokens_as_token_ids": True, **sp}
    if cache_salt:
        gen_body["cache_salt"] = cmpl_body["cache_salt"] = cache_salt
    return gen_body, cmpl_body


def _checked(gen: Generation, url: str, top_logprobs: int) -> Generation:
    """``gen`` (from ``url``) as :meth:`InferenceClient.generate` returns it: alternatives only where they were
    asked for, and one logprob per token (an :class:`InferenceError` otherwise)."""
    if not top_logprobs:
        gen.top_logprobs = None  # the sampled token alone, which ``logprobs`` already holds
    if len(gen.logprobs) != len(gen.token_ids):
        raise InferenceError(f"{url} returned {len(gen.token_ids)} tokens but {len(gen.logprobs)} logprobs",
                             endpoint=url)
    return gen


@dataclass
class _GenerateCall:
    """One :meth:`InferenceClient.generate` call across its attempts: what it sends and asks back, and how
    far it got (the endpoints tried, the ids already handed on to ``on_tokens``)."""

    gen_body: dict[str, Any]
    cmpl_body: dict[str, Any]
    key: str | None
    cost: int
    """Tokens the request may hold on its endpoint (prompt and ``max_tokens``), counted by routing."""
    routing_from: int | None
    sampling_mask: bool
    top_logprobs: int
    on_tokens: OnTokens | None
    tried: list[str] = field(default_factory=list)
    delivered: int = 0

    @property
    def takes_records(self) -> bool:
        """Whether per-request records (MoE routing, sampling masks) are taken from the workers afterwards."""
        return self.routing_from is not None or self.sampling_mask

    @property
    def stream(self) -> OnTokens | None:
        """Where the engine's ids go as they come: on to ``on_tokens``, unless records are taken (then all at
        the end)."""
        return self.forward if self.on_tokens and not self.takes_records else None

    def forward(self, ids: list[int]) -> None:
        """Hand ``ids`` on to ``on_tokens``, counting them."""
        self.delivered += len(ids)
        self.on_tokens(ids)  # type: ignore[misc]


class InferenceClient:
    """Async client over ``endpoints`` (base URLs of vLLM servers); see the module docstring."""

    def __init__(self, endpoints: list[str], model: str = "base", timeout_s: float = 120, max_retries: int = 3,
                 backoff_s: float = 0.5, max_connections: int = 256, pool_shards: int = 16,
                 transport: httpx.AsyncBaseTransport | None = None, headers: dict[str, str] | None = None) -> None:
        self.pool = EndpointPool(endpoints)
        self.model = model
        self.timeout_s = timeout_s
        self.retry = RetryPolicy(max_retries=max_retries, backoff_s=backoff_s)
        # Waiting for a free pooled connection is local back-pressure (pool=None); every network step is bounded.
        # The connections are split over several small pools: httpcore's pool scans all its queued requests
        # against all its connections on every change, which at 100+ concurrent requests costs more CPU
        # than the engine (measured: 2-3x fewer rollouts/s on 2 CPUs with one pool of 256).
        shards = max(1, min(pool_shards, max_connections))
        per = max(1, max_connections // shards)
        self._pools = [
            httpx.AsyncClient(
                timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s), pool=None),
                limits=httpx.Limits(max_connections=per, max_keepalive_connections=per),
                transport=transport,
                headers=headers,
                verify=tls_context(),
            )
            for _ in range(shards)
        ]
        self._http = self._pools[0]
        self._next_pool = 0

    def _pick_pool(self) -> httpx.AsyncClient:
        """The least-busy connection pool (ties: round robin)."""
        self._next_pool = (self._next_pool + 1) % len(self._pools)
        return min(self._pools[self._next_pool:] + self._pools[:self._next_pool], key=_pool_load)

    @property
    def endpoints(self) -> list[str]:
        """The endpoint base URLs."""
        return [e.url for e in self.pool.endpoints]

    async def _send(self, ep: Endpoint, method: str, path: str, *, timeout: float | None = None,
                    **kw: Any) -> httpx.Response:
        kwargs: dict[str, Any] = {"timeout": timeout} if timeout is not None else {}
        try:
            r = await self._pick_pool().request(method, ep.url + path, **kwargs, **kw)
        except httpx.TransportError as e:  # connect/read/write errors and timeouts
            raise TransientError(f"{type(e).__name__}: {e}", refused=isinstance(e, httpx.ConnectError)) from e
        return check_response(r, ep.url + path)

    async def generate(self, prompt_ids: list[int], *, max_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                       top_k: int = 0, stop_token_ids: list[int] | None = None, model: str | None = None,
                       key: str | None = None, seed: int | None = None, cache_salt: str | None = None,
                       ignore_eos: bool = False, routing_from: int | None = None, top_logprobs: int = 0,
                       min_p: float = 0.0, sampling_mask: bool = False,
                       on_tokens: OnTokens | None = None) -> Generation:
        """Sample one completion of ``prompt_ids``; ``model`` is the base name or a LoRA adapter's name.

        Every sampling parameter is sent (penalties and ``min_p`` neutral), so a model's own sampling
        defaults never change the distribution the logprobs describe. ``top_k = 0`` disables top-k.
        ``cache_salt`` partitions the engine's prefix cache: requests only reuse KV blocks computed under
        the same salt. The rollout loop salts with the policy version, so KV computed by old weights is
        never reused for a new version's request (in-flight requests keep their own KV).

        ``routing_from``: also return the MoE expert routing of positions ``routing_from ..`` of the
        request's tokens (``Generation.routing``): vLLM's own ``routed_experts`` where the engine returns
        them, else the capture of agentrl's worker extension (:mod:`agentrl.engine.capture`, enabled with
        :meth:`enable_routing_capture`). Routing needs the token route: it is an error on the
        ``/v1/completions`` fallback.

        ``top_logprobs``: also return each sampled token's ``top_logprobs`` most likely alternatives
        (``Generation.top_logprobs``).

        ``sampling_mask``: also return, per sampled token, the set the truncated distribution (``min_p``,
        ``top_k``, ``top_p``) kept (``Generation.sampling_mask``), from the worker extension's capture
        (:mod:`agentrl.engine.masks`, enabled with :meth:`enable_mask_capture`); the token route only.

        ``on_tokens``: stream the generation, handing each run of new ids to ``on_tokens`` as the engine sends
        them (the whole output at once on the completions fallback, or with ``routing_from``). Once ids have
        been handed on, a failure is not retried on another engine (it would sample other ids): it raises.
        """
        if not prompt_ids:
            raise InvalidArgument("prompt_ids must not be empty")
        sp = _sampling_params(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                              top_logprobs=top_logprobs, stop_token_ids=stop_token_ids, seed=seed,
                              ignore_eos=ignore_eos)
        gen_body, cmpl_body = _request_bodies(model or self.model, prompt_ids, sp, cache_salt)
        call = _GenerateCall(gen_body, cmpl_body, key=key, cost=len(prompt_ids) + max_tokens,
                             routing_from=routing_from, sampling_mask=sampling_mask, top_logprobs=top_logprobs,
                             on_tokens=on_tokens)
        try:
            return await self.retry.run(lambda _: self._generate_attempt(call))
        except RetriesExhausted as e:
            raise InferenceError(f"generate failed after {len(e.errors)} attempts on {sorted(set(call.tried))}; "
                                 f"last error: {e}", endpoint=call.tried[-1] if call.tried else None) from None

    async def _generate_attempt(self, call: _GenerateCall) -> Generation:
        """One attempt of ``call``, on the endpoint routing picks for it; a transient failure fails over
        (:meth:`_fail_over`)."""
        ep = self.pool.pick(call.key, avoid=call.tried)  # NoEnginesError when every endpoint is out of rotation
        ep.begin(call.cost)
        if call.takes_records:
            call.gen_body["request_id"] = uuid.uuid4().hex  # names the request whose records are taken
        try:
            gen = await self._unless_it_leaves(ep, self._generate_on(
                ep, call.gen_body, call.cmpl_body, stream=call.stream))
            await self._take_records(ep, gen, call)
            if call.takes_records and call.on_tokens:  # held back until the records were taken
                call.forward(list(gen.token_ids))
        except TransientError as e:
            raise self._fail_over(ep, e, call) from None
        finally:
            ep.end(call.cost)
        return _checked(gen, ep.url, call.top_logprobs)

    async def _take_records(self, ep: Endpoint, gen: Generation, call: _GenerateCall) -> None:
        """Attach to ``gen`` what ``ep``'s workers recorded of the finished request, where ``call`` asks for it:
        its MoE routing, its sampling masks."""
        if call.routing_from is not None:
            gen.routing = await self._routing_of(ep, gen, call.gen_body["request_id"], call.routing_from)
        if call.sampling_mask:
            gen.sampling_mask = await self._mask_of(ep, gen, call.gen_body["request_id"])

    def _fail_over(self, ep: Endpoint, e: TransientError, call: _GenerateCall) -> Retry | InferenceError:
        """What a transient failure ``e`` of ``call`` on ``ep`` raises: a :class:`Retry` (on another endpoint),
        or an :class:`InferenceError` once ids have been handed on (another engine would sample other ids)."""
        call.tried.append(ep.url)
        if call.delivered:
            return InferenceError(f"{ep.url} failed after streaming {call.delivered} tokens: {e}", endpoint=ep.url)
        # a refused connection means no server: out of rotation at once (a dropped connection or a
        # timeout is retried elsewhere, and the health watch decides about the engine)
        if e.refused and len(self.pool.endpoints) > 1 and self.pool.mark_down(ep.url, f"generate: {e}"):
            log.warning("inference endpoint %s out of rotation: generate: %s", ep.url, e)
        return Retry(f"{ep.url}: {e}")

    @staticmethod
    async def _unless_it_leaves(ep: Endpoint, request: Awaitable[T]) -> T:
        """``request`` on ``ep``, abandoned (a ``TransientError``, so it is retried elsewhere) if ``ep`` leaves
        the rotation first: a lost host's connections would otherwise hang until their read timeout."""
        if ep.left.is_set():
            raise TransientError(f"{ep.url} is out of rotation ({ep.down})")
        done = await unless_set(ep.left, request)
        if done is None:
            raise TransientError(f"{ep.url} left the rotation ({ep.down}) with the request in flight")
        return done.result()

    async def enable_routing_capture(self) -> dict[str, dict[str, Any]]:
        """Start MoE routing capture on every endpoint's workers (idempotent); per endpoint, the first
        worker's record: ``{"ok": True, "layers", "top_k", "experts", "moe_layers", "dtype"}``, or ``{"ok":
        False, "code", "error"}`` where the engine cannot capture (a dense model, an unsupported router)."""
        return await self._first_records("agentrl_routing_enable")

    async def enable_mask_capture(self, active: bool = True) -> dict[str, dict[str, Any]]:
        """Start sampling-mask capture on every endpoint's workers (idempotent; ``active=False`` pauses it);
        per endpoint, the first worker's record: ``{"ok": True, ...}``, or ``{"ok": False, "code", "error"}``
        where it cannot."""
        return await self._first_records("agentrl_masks_enable", ["1" if active else "0"])

    async def _first_records(self, method: str, args: list[str] | None = None) -> dict[str, dict[str, Any]]:
        """Worker method ``method`` on every endpoint: per endpoint, its first worker's record."""
        results = await self.collective_rpc(method, args)
        return {url: (r[0] if r else {"ok": False, "error": "no worker answered"})
                for url, r in zip(self.endpoints, results, strict=True)}

    async def _first_record(self, ep: Endpoint, method: str, args: list[str]) -> dict[str, Any]:
        """Worker method ``method`` on ``ep``: its first worker's record."""
        body = {"method": method, "args": args, "kwargs": {}}
        r = await self._call(ep, "POST", "/collective_rpc", json=body)
        results = list(r.json().get("results") or [])
        return results[0] if results else {"ok": False, "error": "no worker answered"}

    async def _mask_of(self, ep: Endpoint, gen: Generation, request_id: str) -> SamplingMask | None:
        """The sampling masks of one finished request (None when it sampled nothing; an
        :class:`InferenceError` when the engine holds none or they do not cover the completion: a truncated
        sample must never be scored as untruncated)."""
        if not gen.token_ids:
            return None
        if ep.mode == "completions":
            raise InferenceError(f"{ep.url} does not serve the token route: sampling masks cannot be returned "
                                 "on /v1/completions", endpoint=ep.url)
        rec = await self._first_record(ep, "agentrl_masks_take", [request_id])
        if not rec.get("ok"):
            raise InferenceError(f"{ep.url}: no sampling masks for request {request_id}: {rec.get('error')}",
                                 endpoint=ep.url)
        return sampling_mask_of(rec, len(gen.token_ids), ep.url)

    async def _routing_of(self, ep: Endpoint, gen: Generation, request_id: str, start: int) -> RoutingRows | None:
        """The routing of one finished request from ``start`` on: the engine's own, or the worker capture's;
        None (logged) when the engine holds none for it. The next turn of the episode asks again from the
        same position, so one lost answer does not misalign the rest."""
        if ep.mode == "completions":
            raise InferenceError(f"{ep.url} does not serve the token route: MoE routing cannot be returned "
                                 "on /v1/completions (start the server with --enable-scale-out)", endpoint=ep.url)
        if gen.routing is not None:  # vLLM returned routed_experts itself (positions 0 ..)
            return RoutingRows(start, gen.routing.rows[start:])
        rec = await self._first_record(ep, "agentrl_routing_take", [request_id, str(start)])
        if not rec.get("ok"):
            log.warning("%s: no MoE routing for request %s: %s", ep.url, request_id, rec.get("error"))
            return None
        return routing_rows(rec)

    async def _generate_on(self, ep: Endpoint, gen_body: dict[str, Any], cmpl_body: dict[str, Any],
                           parsers: tuple[Any, Any] = (parse_generate, parse_completions),
                           stream: OnTokens | None = None) -> Any:
        """One generation request on ``ep``: the token-in/out route, or ``/v1/completions`` where that route
        is unavailable (detected once); the answer is read by ``parsers`` (one per route). ``stream``: the
        token route streamed, its new ids handed to ``stream`` as they come (on the fallback: all at the end)."""
        if ep.mode != "completions":
            try:
                if stream is not None:
                    body = await stream_generate(self._pick_pool(), ep.url + _GENERATE, gen_body, stream)
                    ep.mode = "generate"
                    return parse_json(parsers[0], lambda: body, ep.url, f"{ep.url} (streamed)")
                r = await self._send(ep, "POST", _GENERATE, json=gen_body)
                ep.mode = "generate"
                return parse_body(parsers[0], r, ep.url)
            except RouteUnavailable as e:
                if ep.mode != "completions":  # once per engine, not once per request that was in flight
                    log.warning("%s; falling back to %s on %s", e, _COMPLETIONS, ep.url)
                    ep.mode = "completions"
        r = await self._send(ep, "POST", _COMPLETIONS, json=cmpl_body)
        gen = parse_body(parsers[1], r, ep.url)
        if stream is not None:
            stream(list(gen.token_ids))
        return gen

    async def _call(self, ep: Endpoint, method: str, path: str, **kw: Any) -> httpx.Response:
        """One admin call on one endpoint, retrying transient failures with backoff (:class:`EngineRefused`
        when the last attempt's connection was refused)."""
        refused = False

        async def attempt(_: int) -> httpx.Response:
            nonlocal refused
            try:
                return await self._send(ep, method, path, **kw)
            except TransientError as e:
                refused = e.refused
                raise Retry(str(e)) from None
            except RouteUnavailable as e:
                raise InferenceError(f"{e} (is the server started with VLLM_SERVER_DEV_MODE=1 and "
                                     "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True?)", endpoint=e.endpoint,
                                     status_code=e.status_code, engine_code=e.engine_code) from None

        try:
            return await self.retry.run(attempt)
        except RetriesExhausted as e:
            error = EngineRefused if refused else InferenceError
            raise error(f"{method} {ep.url}{path} failed after {len(e.errors)} attempts; "
                        f"last error: {e}", endpoint=ep.url) from None

    def _targets(self, only: list[str] | None) -> list[Endpoint]:
        """The endpoints in rotation among those named in ``only`` (all when None); an unknown URL is an
        error, and so is a target list with no endpoint in rotation (:class:`NoEnginesError`)."""
        known = {e.url: e for e in self.pool.endpoints}
        unknown = [u for u in (only or []) if u not in known]
        if unknown:
            raise InvalidArgument(f"not endpoints of this client: {unknown}")
        eps = [known[u] for u in only] if only is not None else list(self.pool.endpoints)
        live = [e for e in eps if not e.down]
        if eps and not live:
            raise NoEnginesError("every targeted inference endpoint is out of rotation: " + "; ".join(
                f"{e.url}: {e.down}" for e in eps))
        return live

    def _drop_failed(self, eps: list[Endpoint], results: list[Any], what: str) -> list[Any]:
        """After a broadcast: endpoints that failed it leave the rotation (with one endpoint or none
        succeeding, raise instead); returns the successful results, in order."""
        failed = [(ep, r) for ep, r in zip(eps, results, strict=True) if isinstance(r, BaseException)]
        if not failed:
            return results
        if len(failed) == len(eps) or len(self.pool.endpoints) == 1:
            others_live = [e for e in self.pool.live if e.url not in {f.url for f in eps}]
            if len(failed) == len(eps) and not others_live and all(isinstance(r, EngineRefused) for _, r in failed):
                # the last engines are gone (not merely erring): out of rotation, and the caller learns that
                # none is left rather than why one call failed
                for ep, r in failed:
                    self.pool.mark_down(ep.url, f"{what} failed: {r}")
                raise NoEnginesError(f"{what}: no inference engine accepts connections any more (" + "; ".join(
                    f"{ep.url}: {r}" for ep, r in failed) + ")")
            if len(failed) == 1 and isinstance(failed[0][1], InferenceError):
                raise failed[0][1]
            # the engines' status and error type, where every failure agrees on them (callers branch on those)
            status = {getattr(r, "status_code", None) for _, r in failed}
            kind = {getattr(r, "engine_code", None) for _, r in failed}
            raise InferenceError("; ".join(str(r) for _, r in failed),
                                 status_code=next(iter(status)) if len(status) == 1 else None,
                                 engine_code=next(iter(kind)) if len(kind) == 1 else None)
        for ep, r in failed:
            if self.pool.mark_down(ep.url, f"{what} failed: {r}"):
                log.warning("inference endpoint %s out of rotation: %s failed: %s", ep.url, what, r)
        return [r for r in results if not isinstance(r, BaseException)]

    async def _broadcast(self, method: str, path: str, *, only: list[str] | None = None, **kw: Any) -> list[float]:
        """Run one admin call on every endpoint in rotation (or those of ``only``) concurrently; seconds per
        endpoint that succeeded. An endpoint that fails leaves the rotation; if every one fails, raise."""

        async def one(ep: Endpoint) -> float:
            t0 = time.perf_counter()
            await self._call(ep, method, path, **kw)
            return time.perf_counter() - t0

        eps = self._targets(only)
        results = await asyncio.gather(*(one(ep) for ep in eps), return_exceptions=True)
        return [float(r) for r in self._drop_failed(eps, list(results), f"{method} {path}")]

    async def load_lora_adapter(self, name: str, path: str, inplace: bool = True,
                                only: list[str] | None = None) -> float:
        """Load (or, with ``inplace``, replace) adapter ``name`` from ``path`` on every endpoint; max seconds.

        vLLM keys its prefix cache on (adapter name, path): reloading changed weights from the *same*
        path serves stale KV for cached prefixes. Write each version to a new path (or ``reset_prefix_cache``).
        """
        body = {"lora_name": name, "lora_path": str(path), "load_inplace": inplace}
        return max(await self._broadcast("POST", "/v1/load_lora_adapter", json=body, only=only))

    async def unload_lora_adapter(self, name: str, missing_ok: bool = True) -> None:
        """Unload adapter ``name`` from every endpoint (a missing adapter is fine with ``missing_ok``)."""
        try:
            await self._broadcast("POST", "/v1/unload_lora_adapter", json={"lora_name": name})
        except InferenceError as e:
            if not (missing_ok and e.engine_code == VLLM_NOT_FOUND):  # vLLM's type for an unknown adapter
                raise

    async def pause(self, mode: str = "keep", only: list[str] | None = None) -> None:
        """Pause generation on every endpoint (or those of ``only``): "keep" freezes in-flight requests until
        ``resume``, "wait" drains them, "abort" ends them (finish_reason "abort")."""
        if mode not in ("keep", "wait", "abort"):
            raise InvalidArgument(f"pause mode must be keep, wait or abort, not {mode!r}")
        await self._broadcast("POST", "/pause", params={"mode": mode}, only=only)

    async def resume(self, only: list[str] | None = None) -> None:
        """Resume generation on every endpoint (or those of ``only``)."""
        await self._broadcast("POST", "/resume", only=only)

    def forget(self, key: str) -> None:
        """Drop ``key``'s engine binding (its episode is over), so that the bindings of a long run do not pile up."""
        self.pool.forget(key)

    def take_out(self, url: str, reason: str) -> None:
        """Take ``url`` out of rotation (e.g. a failed weight load left it with a mix of two versions): no
        request goes there until it rejoins with the current weights."""
        if self.pool.mark_down(url, reason):
            log.warning("inference endpoint %s out of rotation: %s", url, reason)

    async def set_weight_version(self, version: str, only: list[str] | None = None) -> None:
        """Label the weights now being served; later tokens carry it in ``Generation.weight_versions``."""
        await self._broadcast("POST", "/update_weight_version", json={"new_version": str(version)}, only=only)

    async def reset_prefix_cache(self, only: list[str] | None = None, running: bool = False) -> None:
        """Drop every endpoint's prefix cache; ``running`` also preempts running requests, which recompute
        their KV cache when they are scheduled again (vLLM refuses the reset while requests run otherwise)."""
        params = {"reset_running_requests": "true"} if running else None
        await self._broadcast("POST", "/reset_prefix_cache", only=only, params=params)

    async def collective_rpc(self, method: str, args: list[str] | None = None, kwargs: dict[str, str] | None = None,
                             timeout: float | None = None, only: list[str] | None = None) -> list[list[Any]]:
        """Call worker method ``method`` on every endpoint, or those in ``only`` (dev route ``POST
        /collective_rpc``, string arguments only); one list of per-worker results per endpoint, in order."""
        body: dict[str, Any] = {"method": method, "args": list(args or []), "kwargs": dict(kwargs or {})}
        if timeout is not None:
            body["timeout"] = timeout
        http_timeout = self.timeout_s if timeout is None else timeout + 5.0

        async def one(ep: Endpoint) -> list[Any]:
            r = await self._call(ep, "POST", "/collective_rpc", json=body, timeout=http_timeout)
            return list(r.json().get("results") or []) if r.content else []

        eps = self._targets(only)
        results = list(await asyncio.gather(*(one(ep) for ep in eps), return_exceptions=True))
        self._drop_failed(eps, results, f"collective_rpc {method}")
        # An endpoint out of rotation (before or by this call) holds one marker record in its place, so the
        # results line up with the endpoints asked for (``only``, or all).
        got = {ep.url: r for ep, r in zip(eps, results, strict=True) if not isinstance(r, BaseException)}
        asked = only if only is not None else self.endpoints
        return [got[u] if u in got else [{"ok": False, "down": True, "error": f"{u} is out of rotation"}]
                for u in asked]

    def subset(self, urls: list[str]) -> EngineSubset:
        """The admin calls of this client, restricted to the endpoints ``urls`` (weight sync per host)."""
        self._targets(urls)  # unknown URLs fail here
        return EngineSubset(self, list(urls))

    async def reports_sampling_logprobs(self, prompt_ids: list[int], model: str | None = None) -> dict[str, bool]:
        """Per endpoint: whether its logprobs describe the distribution it samples from (vLLM's
        ``--logprobs-mode processed_logprobs``) rather than the model at temperature 1 (``raw_logprobs``).

        Probe: the top-5 candidates of one token at temperature 1 and at 0.25. A raw-mode engine reports
        the same logprobs for both; an engine reporting the sampled distribution sharpens them.
        """

        def top_generate(body: dict[str, Any], url: str) -> dict[object, float]:
            content = body["choices"][0]["logprobs"]["content"][0]
            return {int(c["token_id"]): float(c["logprob"]) for c in content["top_logprobs"]}

        def top_completions(body: dict[str, Any], url: str) -> dict[object, float]:
            return {k: float(v) for k, v in body["choices"][0]["logprobs"]["top_logprobs"][0].items()}

        async def top(ep: Endpoint, temperature: float) -> dict[object, float]:
            sp = {"max_tokens": 1, "temperature": temperature, "logprobs": 5, "seed": 0}
            name = model or self.model
            return await self._generate_on(
                ep, {"model": name, "token_ids": list(prompt_ids), "sampling_params": {**sp, "detokenize": False}},
                {"model": name, "prompt": list(prompt_ids), "return_token_ids": True, **sp},
                parsers=(top_generate, top_completions))

        async def one(ep: Endpoint) -> bool:
            try:
                t1, t025 = await top(ep, 1.0), await top(ep, 0.25)
            except (TransientError, InferenceError) as e:
                raise InferenceError(f"{ep.url}: logprobs probe failed: {type(e).__name__}: {e}",
                                     endpoint=ep.url) from None
            common = set(t1) & set(t025)
            return any(abs(t1[k] - t025[k]) > 1e-3 for k in common) or not common

        oks = await asyncio.gather(*(one(ep) for ep in self.pool.endpoints))
        return {ep.url: ok for ep, ok in zip(self.pool.endpoints, oks, strict=True)}

    async def health(self, only: list[str] | None = None, timeout_s: float | None = None) -> dict[str, bool]:
        """``GET /health`` on every endpoint, in rotation or not (or those in ``only``): one try, a short
        timeout (``timeout_s``, default the smaller of 5 s and the client's timeout)."""
        timeout = min(5.0, self.timeout_s) if timeout_s is None else timeout_s
        eps = [e for e in self.pool.endpoints if only is None or e.url in only]

        async def one(ep: Endpoint) -> bool:
            try:
                r = await self._http.get(ep.url + "/health", timeout=timeout)
            except httpx.HTTPError:
                return False
            return r.status_code == 200

        oks = await asyncio.gather(*(one(ep) for ep in eps))
        return {ep.url: ok for ep, ok in zip(eps, oks, strict=True)}

    async def aclose(self) -> None:
        """Close the connection pool."""
        for pool in self._pools:
            await pool.aclose()

    async def __aenter__(self) -> InferenceClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class EngineSubset:
    """An :class:`InferenceClient`'s weight-sync calls on some of its endpoints only: the same methods, so a
    publisher written for all engines serves a group of them (shared memory for engines on this host, the
    network for the others)."""

    def __init__(self, client: InferenceClient, urls: list[str]) -> None:
        self.client = client
        self.urls = urls

    @property
    def endpoints(self) -> list[str]:
        """The endpoints of this subset."""
        return list(self.urls)

    def subset(self, urls: list[str]) -> EngineSubset:
        """A smaller subset (of the same client)."""
        return self.client.subset(urls)

    async def collective_rpc(self, method: str, args: list[str] | None = None, kwargs: dict[str, str] | None = None,
                             timeout: float | None = None) -> list[list[Any]]:
        """:meth:`InferenceClient.collective_rpc` on this subset."""
        return await self.client.collective_rpc(method, args, kwargs, timeout, only=self.urls)

    async def load_lora_adapter(self, name: str, path: str, inplace: bool = True) -> float:
        """:meth:`InferenceClient.load_lora_adapter` on this subset."""
        return await self.client.load_lora_adapter(name, path, inplace, only=self.urls)

    async def set_weight_version(self, version: str) -> None:
        """:meth:`InferenceClient.set_weight_version` on this subset."""
        await self.client.set_weight_version(version, only=self.urls)

    async def reset_prefix_cache(self, running: bool = False) -> None:
        """:meth:`InferenceClient.reset_prefix_cache` on this subset."""
        await self.client.reset_prefix_cache(only=self.urls, running=running)

    async def pause(self, mode: str = "keep") -> None:
        """:meth:`InferenceClient.pause` on this subset."""
        await self.client.pause(mode, only=self.urls)

    async def resume(self) -> None:
        """:meth:`InferenceClient.resume` on this subset."""
        await self.client.resume(only=self.urls)

    def take_out(self, url: str, reason: str) -> None:
        """:meth:`InferenceClient.take_out` (``url`` of this subset)."""
        self.client.take_out(url, reason)
