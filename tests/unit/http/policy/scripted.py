"""A scripted engine behind the policy endpoint, and clients of it (HTTP and the openai SDK), for unit tests."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import numpy as np
import openai

from agentrl.config.policy import PolicyConfig
from agentrl.core.masks import SamplingMask, encode_row
from agentrl.http.policy.app import create_app
from agentrl.http.policy.service import PolicyService
from agentrl.inference.client import Generation
from agentrl.rollout.chat import ChatFormat
from agentrl.tools.modelgen.tokenizer import train_tokenizer

TOKEN = "t" * 32
TOOLS = [{"type": "function", "function": {"name": "calculate", "description": "Evaluate.",
                                            "parameters": {"type": "object",
                                                           "properties": {"expression": {"type": "string"}}}}}]
CALL = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 + 3"}}\n</tool_call>'


def scripted_chat() -> ChatFormat:
    return ChatFormat(train_tokenizer([CALL, "The answer is 5.", "What is 2 + 3?"] * 20, vocab_size=400))


class Scripted:
    """Answers each call with the next text (plus the end-of-turn id) and records what it was sent."""

    def __init__(self, chat: ChatFormat, texts: list[str], delay: float = 0.0) -> None:
        self.chat, self.texts, self.delay = chat, list(texts), delay
        self.prompts: list[list[int]] = []
        self.outputs: list[list[int]] = []
        self.kwargs: list[dict[str, Any]] = []
        self.streamed = False
        """Whether the last call was streamed (given ``on_tokens``)."""

    async def generate(self, prompt_ids: list[int], **kw: Any) -> Generation:
        self.prompts.append(list(prompt_ids))
        on_tokens = kw.pop("on_tokens", None)
        self.kwargs.append(kw)
        await asyncio.sleep(self.delay)
        ids = [*self.chat.encode(self.texts.pop(0)), self.chat.eos_token_id]
        self.outputs.append(ids)
        self.streamed = on_tokens is not None
        for t in ids if on_tokens else ():  # streamed one id at a time, as an engine's chunks come
            on_tokens([t])
            await asyncio.sleep(0)
        top = kw.get("top_logprobs", 0)  # the sampled id first, then made-up alternatives
        tops = [{t: -0.5, **{(t + k) % 400: -0.5 - k for k in range(1, top)}} for t in ids] if top else None
        mask = None
        if kw.get("sampling_mask"):  # top-k 3 as an engine records it: the sampled id and the next two
            mask = SamplingMask(vocab=400)
            for t in ids:
                kept = np.zeros(400, dtype=bool)
                kept[[t, (t + 1) % 400, (t + 2) % 400]] = True
                count, data = encode_row(kept, 400)
                mask.extend([count], data)
        return Generation(ids, [-0.5] * len(ids), "stop", [("3", 0, len(ids))], endpoint="scripted",
                          top_logprobs=tops, sampling_mask=mask)


def service_of(chat: ChatFormat, texts: list[str], **cfg: Any) -> tuple[PolicyService, Scripted]:
    engine = Scripted(chat, texts, delay=cfg.pop("delay", 0.0))
    return PolicyService(PolicyConfig(token=TOKEN, **cfg), engine, chat), engine


def http_of(service: PolicyService, key: str = TOKEN) -> httpx.AsyncClient:
    app = create_app(service, TOKEN, public_url="http://policy")
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://policy",
                             headers={"Authorization": f"Bearer {key}"})


async def new_episode(http: httpx.AsyncClient) -> dict[str, Any]:
    r = await http.post("/v1/episodes", json={"task_id": "t1"})
    assert r.status_code == 201, r.text
    return r.json()


def in_process(service: PolicyService) -> httpx.AsyncClient:
    """An HTTP client whose requests go to the endpoint's app in this process (for any SDK that takes one)."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(service, TOKEN, public_url="http://policy")))


def sdk_of(service: PolicyService, ep: dict[str, Any]) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0,
                              http_client=in_process(service))
