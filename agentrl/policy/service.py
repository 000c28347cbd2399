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
from agentrl.http.errors import ApiError
from agentrl.inference.wire import ContextLengthError, InferenceError
from agentrl.policy.episodes import EpisodeBook, PolicyEpisode
from agentrl.policy.messages import ChatRequest, check_request, normalize_all, tools_key
from agentrl.policy.rows import Row, commit, plan_call
from agentrl.rollout.chat import ChatFormat
from agentrl.rollout.generator import Generator
from agentrl.versions import VersionLabelError, token_versions

log = logging.getLogger("agentrl.policy")


class PolicyService:
    """Serves chat completions from ``client`` with ``chat``'s template and parser, recording episodes."""

    def __init__(self, config: PolicyConfig, client: Generator, chat: ChatFormat, *, model: str | None = None,
                 policy_version: Callable[[], int] = lambda: 0) -> None:
        self.config = config
        self.client = client
        self.chat = chat
        self.model = model
        """The engine model to sample from (the run's adapter name; None: the client's default)."""
        self.policy_version = policy_version
        self.book = EpisodeBook(config.episode_ttl_s, config.max_open_episodes, config.max_kept_episodes)
        self.calls = 0

    def temperature(self, req: ChatRequest) -> float:
        if self.config.temperature is not None:
            return self.config.temperature
        return 1.0 if req.temperature is None else req.temperature

    async def complete(self, req: ChatRequest, episode: PolicyEpisode | None) -> dict[str, Any]:
        """Answer one request as an OpenAI ``chat.completion``; record it in ``episode`` (None: not recorded)."""
        check_request(req)
        messages = normalize_all(req.messages)
        tools = req.tools or None
        if episode is None:
            return await self._call([], messages, tools, req)
        # One call of an episode at a time, and the generation runs in a task of its own: a client that
        # disconnects (cancelling this handler) leaves the call to finish and be recorded in order.
        async with episode.lock:
            if not episode.open:
                raise ApiError(401, "this episode's API key has expired: its episode is over")
            episode.last_seen = time.monotonic()
            task = asyncio.ensure_future(self._call(episode.rows, messages, tools, req, episode))
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                if not task.done():
                    await asyncio.wait([task])
                raise
            finally:
                episode.last_seen = time.monotonic()

    async def _call(self, rows: list[Row], messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    req: ChatRequest, episode: PolicyEpisode | None = None) -> dict[str, Any]:
        temperature = self.temperature(req)
        try:
            plan = plan_call(rows, self.chat, messages, tools, tools_key(tools), temperature)
        except Exception as e:  # the template refuses these messages (e.g. roles out of order)
            raise ApiError(400, f"the chat template cannot render these messages: {type(e).__name__}: {e}",
                           code="invalid_request_error") from None
        room = self.config.max_context_tokens - len(plan.prompt_ids)
        if room <= 0:
            raise ApiError(400, f"the prompt is {len(plan.prompt_ids)} tokens; this endpoint's context is "
                                f"{self.config.max_context_tokens}", code="context_length_exceeded")
        asked = req.max_completion_tokens or req.max_tokens or self.config.max_tokens_per_call
        budget = min(asked, self.config.max_tokens_per_call, room)
        sent = self.policy_version()
        try:
            gen = await asyncio.wait_for(self.client.generate(
                plan.prompt_ids, max_tokens=budget, temperature=temperature,
                top_p=1.0 if self.config.temperature is not None else (req.top_p or 1.0),
                stop_token_ids=list(self.chat.stop_token_ids), model=self.model,
                key=episode.id if episode else None, cache_salt=f"policy-v{sent}"), self.config.generate_timeout_s)
            versions = token_versions(gen, sent)
        except ContextLengthError as e:
            raise ApiError(400, str(e), code="context_length_exceeded") from None
        except (InferenceError, VersionLabelError, asyncio.TimeoutError) as e:
            if episode is not None:
                episode.failed_calls += 1
            raise ApiError(503, f"the inference engine failed: {type(e).__name__}: {e}", code="engine_error") from None
        self.calls += 1
        text = self.chat.decode(gen.token_ids)
        cut = gen.finish_reason == "length" or not self.chat.ends_turn(gen.token_ids)
        answer, finish = self._answer(text, tools, req, cut)
        if episode is not None:
            commit(rows, plan, gen.token_ids, list(gen.logprobs), versions, answer)
            episode.calls += 1
        n_prompt, n_out = len(plan.prompt_ids), len(gen.token_ids)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": req.model or self.config.served_model,
            "choices": [{"index": 0, "message": _openai_message(answer), "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out},
        }

    def _answer(self, text: str, tools: list[dict[str, Any]] | None, req: ChatRequest,
                cut: bool) -> tuple[dict[str, Any], str]:
        """The assistant message (normal form) and the finish reason of a sampled turn."""
        if tools and req.tool_choice != "none" and not cut:
            parsed = self.chat.parse(text, tools)
            if parsed.tool_calls and not parsed.errors:
                calls = [{"id": c.id, "type": "function",
                          "function": {"name": c.name, "arguments": c.arguments}} for c in parsed.tool_calls]
                return {"role": "assistant", "content": parsed.content, "tool_calls": calls}, "tool_calls"
        # no call, a call that could not be read, or a cut turn: the model's text, whole
        return {"role": "assistant", "content": text.strip()}, "length" if cut else "stop"


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
