"""The policy endpoint's logic with a scripted engine: OpenAI SDK compatibility, per-episode keys, stitching
calls into token-faithful rows (a new row when the agent rewrites its history), rewards, TTL and bad input."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest

from agentrl.config.policy import PolicyConfig
from agentrl.inference.client import Generation
from agentrl.modelgen.tokenizer import train_tokenizer
from agentrl.policy.app import create_app
from agentrl.policy.service import PolicyService
from agentrl.rollout.chat import ChatFormat

TOKEN = "t" * 32
TOOLS = [{"type": "function", "function": {"name": "calculate", "description": "Evaluate.",
                                            "parameters": {"type": "object",
                                                           "properties": {"expression": {"type": "string"}}}}}]
CALL = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 + 3"}}\n</tool_call>'


@pytest.fixture(scope="module")
def chat() -> ChatFormat:
    return ChatFormat(train_tokenizer([CALL, "The answer is 5.", "What is 2 + 3?"] * 20, vocab_size=400))


class Scripted:
    """Answers each call with the next text (plus the end-of-turn id) and records what it was sent."""

    def __init__(self, chat: ChatFormat, texts: list[str], delay: float = 0.0) -> None:
        self.chat, self.texts, self.delay = chat, list(texts), delay
        self.prompts: list[list[int]] = []
        self.outputs: list[list[int]] = []

    async def generate(self, prompt_ids: list[int], **kw: Any) -> Generation:
        self.prompts.append(list(prompt_ids))
        await asyncio.sleep(self.delay)
        ids = [*self.chat.encode(self.texts.pop(0)), self.chat.eos_token_id]
        self.outputs.append(ids)
        return Generation(ids, [-0.5] * len(ids), "stop", [("3", 0, len(ids))], None, "scripted")


def _service(chat: ChatFormat, texts: list[str], **cfg: Any) -> tuple[PolicyService, Scripted]:
    engine = Scripted(chat, texts, delay=cfg.pop("delay", 0.0))
    return PolicyService(PolicyConfig(token=TOKEN, **cfg), engine, chat), engine


def _http(service: PolicyService, key: str = TOKEN) -> httpx.AsyncClient:
    app = create_app(service, TOKEN, public_url="http://policy")
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://policy",
                             headers={"Authorization": f"Bearer {key}"})


async def _episode(http: httpx.AsyncClient) -> dict[str, Any]:
    r = await http.post("/v1/episodes", json={"task_id": "t1"})
    assert r.status_code == 201, r.text
    return r.json()


def _sdk(service: PolicyService, ep: dict[str, Any]) -> openai.AsyncOpenAI:
    app = create_app(service, TOKEN, public_url="http://policy")
    return openai.AsyncOpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0,
                              http_client=httpx.AsyncClient(transport=httpx.ASGITransport(app=app)))


async def test_sdk_tool_loop_is_one_token_faithful_row(chat: ChatFormat) -> None:
    service, engine = _service(chat, [CALL, "The answer is 5."])
    async with _http(service) as http:
        ep = await _episode(http)
        assert ep["base_url"] == "http://policy/v1" and ep["api_key"].startswith("ep-")
        sdk = _sdk(service, ep)
        messages: list[Any] = [{"role": "system", "content": "Use the tool."}, {"role": "user", "content": "What is 2 + 3?"}]
        r = await sdk.chat.completions.create(model="any", messages=messages, tools=TOOLS, temperature=1.0)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        call = choice.message.tool_calls[0]
        assert call.function.name == "calculate" and json.loads(call.function.arguments) == {"expression": "2 + 3"}
        messages += [choice.message.model_dump(exclude_none=False), {"role": "tool", "tool_call_id": call.id, "content": "5"}]
        r = await sdk.chat.completions.create(model="any", messages=messages, tools=TOOLS)
        assert r.choices[0].message.content == "The answer is 5." and r.choices[0].finish_reason == "stop"
        assert (await http.post(f"/v1/episodes/{ep['episode_id']}/reward", json={"reward": 1.0})).status_code == 200
        traj = (await http.get(f"/v1/episodes/{ep['episode_id']}/trajectory")).json()
    (row,) = traj["rows"]
    assert row["reward"] == 1.0 and traj["status"] == "ended" and row["calls"] == 2
    # the second call's prompt is the first prompt + the sampled ids + the template's delta, exactly
    p0, p1 = engine.prompts
    assert p1[: len(p0) + len(engine.outputs[0])] == p0 + engine.outputs[0]
    assert row["prompt_ids"] == p0 and row["prompt_ids"] + row["completion_ids"] == p1 + engine.outputs[1]
    model_ids = [t for t, m in zip(row["completion_ids"], row["loss_mask"], strict=True) if m]
    assert model_ids == engine.outputs[0] + engine.outputs[1]
    assert [v for v, m in zip(row["versions"], row["loss_mask"], strict=True) if m] == [3] * len(model_ids)
    assert all(lp == -0.5 for lp, m in zip(row["logprobs"], row["loss_mask"], strict=True) if m)
    assert all(v == -1 and lp == 0.0 for v, lp, m in zip(row["versions"], row["logprobs"], row["loss_mask"], strict=True) if not m)


async def test_rewritten_history_starts_a_new_row(chat: ChatFormat) -> None:
    service, engine = _service(chat, [CALL, "The answer is 5.", "The answer is 5."])
    async with _http(service) as http:
        ep = await _episode(http)
        sdk = _sdk(service, ep)
        messages: list[Any] = [{"role": "user", "content": "What is 2 + 3?"}]
        r = await sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        messages += [r.choices[0].message.model_dump(), {"role": "tool", "tool_call_id": r.choices[0].message.tool_calls[0].id,
                                                         "content": "5"}]
        await sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        # the agent summarises its history: a new row, rendered whole
        summary = [{"role": "user", "content": "What is 2 + 3? (the tool said 5)"}]
        await sdk.chat.completions.create(model="m", messages=summary, tools=TOOLS)
        await http.post(f"/v1/episodes/{ep['episode_id']}/reward", json={"reward": 0.5})
        traj = (await http.get(f"/v1/episodes/{ep['episode_id']}/trajectory", headers={"Authorization": f"Bearer {ep['api_key']}"})).json()
    assert [r["calls"] for r in traj["rows"]] == [2, 1] and all(r["reward"] == 0.5 for r in traj["rows"])
    second = traj["rows"][1]
    assert second["prompt_ids"] == engine.prompts[2] == chat.prompt_ids(summary, TOOLS)
    assert second["completion_ids"] == engine.outputs[2] and second["loss_mask"] == [1] * len(engine.outputs[2])


async def test_keys_and_bad_input(chat: ChatFormat) -> None:
    service, _ = _service(chat, ["The answer is 5."] * 3)
    async with _http(service) as http:
        ep = await _episode(http)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        for key, status in (("nope", 401), (ep["api_key"] + "x", 401)):
            r = await http.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == status and r.json()["error"]["code"] == "unauthorized", r.text
        assert (await http.post("/v1/chat/completions", json=body, headers={"Authorization": ""})).status_code == 401
        own = {"Authorization": f"Bearer {ep['api_key']}"}
        assert (await http.post("/v1/episodes", headers=own)).status_code == 403  # an episode key cannot create
        for bad, words in (({**body, "stream": True}, "stream"), ({**body, "n": 2}, "n must be 1"),
                           ({**body, "tool_choice": "required"}, "tool_choice"),
                           ({**body, "messages": [{"role": "robot", "content": "x"}]}, "role"),
                           ({**body, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "text parts"),
                           ({**body, "tools": [{"type": "function"}]}, "tools[0]")):
            r = await http.post("/v1/chat/completions", json=bad, headers=own)
            assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
        r = await http.post("/v1/chat/completions", content=b"{not json", headers={**own, "content-type": "application/json"})
        assert r.status_code == 422 and "not valid JSON" in r.json()["error"]["message"]
        assert (await http.post("/v1/chat/completions", json={"model": "m", "messages": []}, headers=own)).status_code == 422
        r = await http.post(f"/v1/episodes/{ep['episode_id']}/reward", json={"reward": "nan"}, headers=own)
        assert r.status_code == 422
        assert (await http.post("/v1/chat/completions", json=body, headers=own)).status_code == 200
        assert (await http.post(f"/v1/episodes/{ep['episode_id']}/reward", json={"reward": 1}, headers=own)).status_code == 200
        r = await http.post("/v1/chat/completions", json=body, headers=own)
        assert r.status_code == 401 and "expired" in r.json()["error"]["message"]
        # the server token is served, not recorded
        assert (await http.post("/v1/chat/completions", json=body)).status_code == 200
        assert (await http.get("/v1/models")).json()["data"][0]["id"] == "agentrl-policy"
    assert service.book.get(ep["episode_id"]).calls == 1


async def test_ttl_closes_a_silent_episode_as_failed(chat: ChatFormat) -> None:
    service, _ = _service(chat, ["x"], episode_ttl_s=0.2)
    async with _http(service) as http:
        ep = await _episode(http)
        await asyncio.sleep(0.3)
        r = await http.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                            headers={"Authorization": f"Bearer {ep['api_key']}"})
        assert r.status_code == 401 and "expired" in r.json()["error"]["message"]
        traj = (await http.get(f"/v1/episodes/{ep['episode_id']}/trajectory")).json()
    assert traj["status"] == "expired" and traj["reward"] is None and "TTL" in traj["error"]


async def test_a_disconnected_call_is_still_recorded_in_order(chat: ChatFormat) -> None:
    service, engine = _service(chat, ["The answer is 5.", "Again 5."], delay=0.3)
    async with _http(service) as http:
        ep = await _episode(http)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        own = {"Authorization": f"Bearer {ep['api_key']}"}
        gone = asyncio.ensure_future(http.post("/v1/chat/completions", json=body, headers=own))
        await asyncio.sleep(0.1)
        gone.cancel()  # the client goes away mid-generation
        r = await http.post("/v1/chat/completions", json=body, headers=own)  # its retry waits for the first
        assert r.status_code == 200
        traj = (await http.get(f"/v1/episodes/{ep['episode_id']}/trajectory")).json()
    assert traj["calls"] == 2 and [row["completion_ids"] for row in traj["rows"]] == engine.outputs
