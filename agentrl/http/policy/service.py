"""One chat completion of the policy endpoint: check, render, generate from ids, parse tool calls, record.

Generation goes through the run's :class:`~agentrl.rollout.generator.Generator` (the same client, routing,
prefix-cache salt and version tagging as agentrl's own loop): each sampled token carries its behaviour
logprob and the policy version that produced it (two versions when a weight update lands mid-call).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from agentrl.config.policy import PolicyConfig
from agentrl.core.types import Routing
from agentrl.core.versions import VersionLabelError, token_versions
from agentrl.http.errors import ApiError
from agentrl.http.policy.episodes import EpisodeBook, PolicyEpisode
from agentrl.http.policy.messages import ChatRequest, check_request, forced_call, normalize_all, tools_key
from agentrl.http.policy.responses import ResponsesRequest, ResponseStore, response_object, to_chat
from agentrl.http.policy.rows import Routed, Row, commit, fork, plan_call, prefill
from agentrl.inference.client import Generation
from agentrl.inference.stream import OnTokens
from agentrl.inference.wire import ContextLengthError, InferenceError
from agentrl.rollout.chat import ChatFormat, UnusableChatTemplate
from agentrl.rollout.generator import Generator

log = logging.getLogger("agentrl.http.policy")


class PolicyService:
    """Serves chat completions from ``client`` with ``chat``'s template and parser, recording episodes."""

    def __init__(self, config: PolicyConfig, client: Generator, chat: ChatFormat, *, model: str | None = None,
                 policy_version: Callable[[], int] = lambda: 0, routing: Routing | None = None) -> None:
        self.config = config
        self.routing = routing
        """MoE models with routing capture on: the empty routing each row starts from (rows then record the
        experts of every position they hold, for replay); None: rows carry no routing."""
        self.client = client
        self.chat = chat
        self.model = model
        """The engine model to sample from (the run's adapter name; None: the client's default)."""
        self.policy_version = policy_version
        self.book = EpisodeBook(config.episode_ttl_s, config.max_open_episodes, config.max_kept_episodes)
        if (forget := getattr(client, "forget", None)) is not None:  # an episode's calls stick to one engine
            self.book.on_finish = lambda ep: forget(ep.id)
        self.responses = ResponseStore(config.max_stored_responses)
        self.calls = 0
        self._running: set[asyncio.Future[Any]] = set()

    def keep(self, task: asyncio.Future[Any]) -> asyncio.Future[Any]:
        """Hold a call's task until it ends (a streamed call outlives its response when the client leaves);
        its error, if nobody reads it, is dropped quietly (it was answered or the client is gone)."""
        self._running.add(task)
        task.add_done_callback(lambda t: (self._running.discard(t), t.cancelled() or t.exception()))
        return task

    def temperature(self, req: ChatRequest, episode: PolicyEpisode | None = None) -> float:
        """The temperature of a call: its episode's, else the endpoint's, else the request's (1 by default)."""
        if episode is not None and episode.temperature is not None:
            return episode.temperature
        if self.config.temperature is not None:
            return self.config.temperature
        return 1.0 if req.temperature is None else req.temperature

    def live_markers(self, req: ChatRequest) -> list[str] | None:
        """Where a streamed turn's text must be held back (the start of a tool call, the stop sequences), or
        None when ``req`` is not streamed token by token: ``n > 1``, ``logprobs``, a forced tool call, or a
        template whose tool calls cannot be located (those turns are sent whole once sampled)."""
        if (req.n or 1) > 1 or req.logprobs or forced_call(req.tool_choice) is not None:
            return None
        markers = list(req.stops)
        if req.tools and req.tool_choice != "none":
            try:
                opening = self.chat.call_opening(req.tools, None)
            except UnusableChatTemplate:
                return None
            marker = opening.split(maxsplit=1)[0] if opening.strip() else ""
            if not marker:
                return None
            markers.append(marker)
        return markers

    async def complete(self, req: ChatRequest, episode: PolicyEpisode | None,
                       on_tokens: OnTokens | None = None) -> dict[str, Any]:
        """Answer one request as an OpenAI ``chat.completion``; record it in ``episode`` (None: not recorded).
        ``on_tokens`` (with ``n = 1``): gets the sampled ids as the engine streams them."""
        check_request(req)
        messages = normalize_all(req.messages)
        tools = req.tools or None
        if episode is None:
            return await self._call([], messages, tools, req, on_tokens=on_tokens)
        # One call of an episode at a time, and the generation runs in a task of its own: a client that
        # disconnects (cancelling this handler) leaves the call to finish and be recorded in order.
        async with episode.lock:
            if not episode.open:
                raise ApiError(401, "this episode's API key has expired: its episode is over")
            episode.last_seen = time.monotonic()
            task = asyncio.ensure_future(self._call(episode.rows, messages, tools, req, episode, on_tokens))
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                if not task.done():
                    await asyncio.wait([task])
                raise
            finally:
                episode.last_seen = time.monotonic()

    async def respond(self, req: ResponsesRequest, episode: PolicyEpisode | None) -> dict[str, Any]:
        """Answer one Responses API request as a ``response`` object, through :meth:`complete` (so it is
        recorded as the same conversation sent as a chat completion); keep it for ``previous_response_id``."""
        owner = episode.id if episode is not None else ""
        history = self.responses.conversation(owner, req.previous_response_id) if req.previous_response_id else []
        chat, added = to_chat(req, history)
        completion = await self.complete(chat, episode)
        response = response_object(req, completion, f"resp_{uuid.uuid4().hex}")
        self.responses.put(owner, response["id"], req.previous_response_id,
                           [*added, completion["choices"][0]["message"]])
        return response

    async def _call(self, rows: list[Row], messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    req: ChatRequest, episode: PolicyEpisode | None = None,
                    on_tokens: OnTokens | None = None) -> dict[str, Any]:
        temperature = self.temperature(req, episode)
        try:
            plan = plan_call(rows, self.chat, messages, tools, tools_key(tools), temperature)
        except Exception as e:  # the template refuses these messages (e.g. roles out of order)
            raise ApiError(400, f"the chat template cannot render these messages: {type(e).__name__}: {e}",
                           code="invalid_request_error", param="messages") from None
        opening = self._opening(tools, req)
        if opening:
            plan = prefill(plan, self.chat.encode(opening))
        room = self.config.context_tokens - len(plan.prompt_ids)
        if room <= 0:
            raise ApiError(400, f"the prompt is {len(plan.prompt_ids)} tokens; this endpoint's context is "
                                f"{self.config.context_tokens}", code="context_length_exceeded", param="messages")
        asked = req.max_completion_tokens or req.max_tokens or self.config.max_tokens_per_call
        budget = min(asked, self.config.max_tokens_per_call, room)
        sent = self.policy_version()
        try:
            routing_from = (plan.row.routing.n if plan.row is not None and plan.row.routing is not None else 0) \
                if self.routing is not None and episode is not None else None
            gens = await asyncio.wait_for(self._sample(plan.prompt_ids, budget, temperature, req, episode, sent,
                                                       on_tokens, routing_from),
                                          self.config.generate_timeout_s)
            versions = [token_versions(gen, sent) for gen in gens]
        except ContextLengthError as e:
            raise ApiError(400, str(e), code="context_length_exceeded", param="messages") from None
        except (InferenceError, VersionLabelError, asyncio.TimeoutError) as e:
            if episode is not None:
                episode.failed_calls += 1
            raise ApiError(503, f"the inference engine failed: {type(e).__name__}: {e}", code="engine_error") from None
        self.calls += 1
        choices, n_out = [], 0
        for i, (gen, gen_versions) in enumerate(zip(gens, versions, strict=True)):
            ids, logprobs, kept_versions, answer, finish = self._turn(gen, gen_versions, tools, req, opening)
            if episode is not None:  # the first choice extends the row; each other one starts its own
                mask = gen.sampling_mask.head(len(ids)) if gen.sampling_mask is not None else None
                routed = Routed(self.routing, gen.routing, sent) if self.routing is not None else None
                commit(rows, plan if i == 0 else fork(plan), ids, logprobs, kept_versions, answer, mask, routed)
            choices.append({"index": i, "message": _openai_message(answer), "finish_reason": finish,
                            "logprobs": self._logprobs(gen, len(ids), req.top_logprobs or 0) if req.logprobs else None})
            n_out += len(ids)
        if episode is not None:
            episode.calls += 1
        n_prompt = len(plan.prompt_ids)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": req.model or self.config.served_model, "choices": choices,
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out},
        }

    def _opening(self, tools: list[dict[str, Any]] | None, req: ChatRequest) -> str:
        """The opening of the tool call that ``req.tool_choice`` forces (see
        :meth:`~agentrl.rollout.chat.ChatFormat.call_opening`), or "" when it forces none."""
        forced = forced_call(req.tool_choice)
        if forced is None:
            return ""
        try:
            return self.chat.call_opening(tools, forced or None)
        except UnusableChatTemplate as e:
            raise ApiError(400, f"tool_choice {req.tool_choice!r}: {e}", code="invalid_request_error",
                           param="tool_choice") from None

    async def _sample(self, prompt_ids: list[int], budget: int, temperature: float, req: ChatRequest,
                      episode: PolicyEpisode | None, sent: int, on_tokens: OnTokens | None = None,
                      routing_from: int | None = None) -> list[Generation]:
        """``req.n`` generations of one prompt, at once (choice ``i`` seeded ``seed + i`` when seeded); the
        others are cancelled if one fails. ``on_tokens``: the first choice's ids as they are sampled.
        ``routing_from``: MoE routing of the first choice's positions from there on (a row's missing ones),
        of every other choice's from 0 (each starts a row of its own)."""
        c = self.config
        pinned = c.temperature is not None  # training: the run's sampling, whatever the request says
        top_p = c.top_p if pinned else (req.top_p or 1.0)
        cut = {"top_k": c.top_k, "min_p": c.min_p} if pinned and (c.top_k or c.min_p) else {}
        masks = c.sampling_masks and episode is not None and (top_p < 1 or bool(cut))
        tasks = [asyncio.ensure_future(self.client.generate(
            prompt_ids, max_tokens=budget, temperature=temperature, top_p=top_p, **cut,
            **({"sampling_mask": True} if masks else {}),
            **({"routing_from": routing_from if i == 0 else 0} if routing_from is not None else {}),
            stop_token_ids=list(self.chat.stop_token_ids), model=self.model, key=episode.id if episode else None,
            **({"seed": req.seed + i} if req.seed is not None else {}),
            **({"top_logprobs": req.top_logprobs} if req.logprobs and req.top_logprobs else {}),
            cache_salt=f"policy-v{sent}", **({"on_tokens": on_tokens} if on_tokens and i == 0 else {})))
            for i in range(req.n or 1)]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            raise

    def _turn(self, gen: Generation, versions: list[int], tools: list[dict[str, Any]] | None, req: ChatRequest,
              opening: str = "") -> tuple[list[int], list[float], list[int], dict[str, Any], str]:
        """One choice: the sampled ids kept (cut after a stop sequence, as a prefix of what was sampled), their
        logprobs and versions, the answer (normal form) and the finish reason. ``opening``: the text of a
        forced call's opening, which the sampled text continues."""
        ids, logprobs = list(gen.token_ids), list(gen.logprobs)
        text = self.chat.decode(ids)
        stopped = _first_stop(text, req.stops)
        if stopped is not None:
            keep = _ids_covering(self.chat, ids, stopped[1])
            ids, logprobs, versions = ids[:keep], logprobs[:keep], versions[:keep]
            answer = {"role": "assistant", "content": (opening + text[: stopped[0]]).strip()}
            return ids, logprobs, versions, answer, "stop"
        cut = gen.finish_reason == "length" or not self.chat.ends_turn(ids)
        answer, finish = self._answer(opening + text, tools, req, cut)
        return ids, logprobs, versions, answer, finish

    def _logprobs(self, gen: Generation, n: int, top: int) -> dict[str, Any]:
        """OpenAI's ``choices[].logprobs`` for the first ``n`` sampled ids, each with its ``top`` most likely
        alternatives where the engine returned them."""
        def entry(token_id: int, lp: float) -> dict[str, Any]:
            token = self.chat.decode([token_id])
            return {"token": token, "logprob": lp, "bytes": list(token.encode())}

        alternatives = gen.top_logprobs or []
        out = []
        for k, (token_id, lp) in enumerate(zip(gen.token_ids[:n], gen.logprobs[:n], strict=True)):
            tops = alternatives[k] if top and k < len(alternatives) else {}
            ranked = sorted(tops.items(), key=lambda kv: -kv[1])[:top]
            out.append({**entry(token_id, lp), "top_logprobs": [entry(t, v) for t, v in ranked]})
        return {"content": out, "refusal": None}

    def _answer(self, text: str, tools: list[dict[str, Any]] | None, req: ChatRequest,
                cut: bool) -> tuple[dict[str, Any], str]:
        """The assistant message (normal form) and the finish reason of a sampled turn."""
        if tools and req.tool_choice != "none" and not cut:
            parsed = self.chat.parse(text, tools)
            if parsed.tool_calls and not parsed.errors:
                calls = [{"id": c.id, "type": "function",
                          "function": {"name": c.name, "arguments": c.arguments}} for c in parsed.tool_calls]
                if req.parallel_tool_calls is False:
                    calls = calls[:1]  # the first call is answered; the ids of the others stay in the row
                return {"role": "assistant", "content": parsed.content, "tool_calls": calls}, "tool_calls"
        # no call, a call that could not be read, or a cut turn: the model's text, whole
        return {"role": "assistant", "content": text.strip()}, "length" if cut else "stop"


def _first_stop(text: str, stops: list[str]) -> tuple[int, int] | None:
    """``(start, end)`` of the earliest stop sequence in ``text``, or None."""
    hits = [(i, i + len(s)) for s in stops if (i := text.find(s)) >= 0]
    return min(hits) if hits else None


def _ids_covering(chat: ChatFormat, ids: list[int], chars: int) -> int:
    """The fewest leading ``ids`` whose text holds the first ``chars`` characters."""
    for k in range(1, len(ids) + 1):
        if len(chat.decode(ids[:k])) >= chars:
            return k
    return len(ids)


def _openai_message(answer: dict[str, Any]) -> dict[str, Any]:
    """The normal-form answer as the OpenAI response carries it (arguments as JSON text)."""
    out: dict[str, Any] = {"role": "assistant", "content": answer["content"] or None, "refusal": None}
    if answer.get("tool_calls"):
        out["tool_calls"] = [{"id": c["id"], "type": "function",
                              "function": {"name": c["function"]["name"],
                                           "arguments": json.dumps(c["function"]["arguments"])}}
                             for c in answer["tool_calls"]]
    else:
        out["content"] = answer["content"]
    return out
