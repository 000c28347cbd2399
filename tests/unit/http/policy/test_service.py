"""The policy endpoint's logic with a scripted engine: OpenAI SDK compatibility, per-episode keys, stitching
calls into token-faithful rows (a new row when the agent rewrites its history), rewards, TTL and bad input."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from agentrl.rollout.chat import ChatFormat
from tests.unit.http.policy.scripted import (
    CALL,
    TOOLS,
    http_of,
    new_episode,
    scripted_chat,
    sdk_of,
    service_of,
)


@pytest.fixture(scope="module")
def chat() -> ChatFormat:
    return scripted_chat()


async def test_sdk_tool_loop_is_one_token_faithful_row(chat: ChatFormat) -> None:
    service, engine = service_of(chat, [CALL, "The answer is 5."])
    async with http_of(service) as http:
        ep = await new_episode(http)
        assert ep["base_url"] == "http://policy/v1" and ep["api_key"].startswith("ep-")
        sdk = sdk_of(service, ep)
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


async def _tool_episode(chat: ChatFormat, stream: bool) -> tuple[dict[str, Any], list[Any]]:
    """The tool loop of the test above, streamed or not: the trajectory and the messages the agent built."""
    service, _ = service_of(chat, [CALL, "The answer is 5."])
    async with http_of(service) as http:
        ep = await new_episode(http)
        sdk = sdk_of(service, ep)
        messages: list[Any] = [{"role": "user", "content": "What is 2 + 3?"}]
        for _ in range(2):
            if not stream:
                msg = (await sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS)).choices[0].message
                messages.append(msg.model_dump(exclude_none=True))
            else:
                content, calls, finish = "", {}, None
                async for chunk in await sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS,
                                                                     stream=True, stream_options={"include_usage": True}):
                    if not chunk.choices:
                        assert chunk.usage is not None and chunk.usage.completion_tokens > 0
                        continue
                    delta = chunk.choices[0].delta
                    content += delta.content or ""
                    for c in delta.tool_calls or []:
                        calls[c.index] = {"id": c.id, "type": "function",
                                          "function": {"name": c.function.name, "arguments": c.function.arguments}}
                    finish = chunk.choices[0].finish_reason or finish
                assert finish in ("tool_calls", "stop")
                msg_dict: dict[str, Any] = {"role": "assistant", "content": content or None}
                if calls:
                    msg_dict["tool_calls"] = [calls[k] for k in sorted(calls)]
                messages.append({k: v for k, v in msg_dict.items() if v is not None})
            if messages[-1].get("tool_calls"):
                messages.append({"role": "tool", "tool_call_id": messages[-1]["tool_calls"][0]["id"], "content": "5"})
        await http.post(f"/v1/episodes/{ep['episode_id']}/reward", json={"reward": 1.0})
        return (await http.get(f"/v1/episodes/{ep['episode_id']}/trajectory")).json(), messages


async def test_a_streamed_episode_records_the_rows_of_an_unstreamed_one(chat: ChatFormat) -> None:
    plain, plain_messages = await _tool_episode(chat, stream=False)
    streamed, streamed_messages = await _tool_episode(chat, stream=True)
    assert [r["calls"] for r in streamed["rows"]] == [2]
    keys = ("prompt_ids", "completion_ids", "loss_mask", "logprobs", "versions")
    assert [{k: r[k] for k in keys} for r in streamed["rows"]] == [{k: r[k] for k in keys} for r in plain["rows"]]
    assert [m["role"] for m in streamed_messages] == [m["role"] for m in plain_messages]
    calls = [[(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in m.get("tool_calls") or []]
             for m in (plain_messages, streamed_messages) for m in m]
    assert calls[: len(plain_messages)] == calls[len(plain_messages):]
    assert streamed_messages[-1]["content"] == plain_messages[-1]["content"] == "The answer is 5."


async def test_n_choices_are_rows_of_their_own_and_the_agent_continues_one(chat: ChatFormat) -> None:
    service, engine = service_of(chat, ["The answer is 4.", CALL, "The answer is 5."])
    async with http_of(service) as http:
        ep = await new_episode(http)
        sdk = sdk_of(service, ep)
        messages: list[Any] = [{"role": "user", "content": "What is 2 + 3?"}]
        r = await sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS, n=2, seed=7)
        assert [c.index for c in r.choices] == [0, 1] and r.choices[1].finish_reason == "tool_calls"
        assert r.usage.completion_tokens == len(engine.outputs[0]) + len(engine.outputs[1])
        picked = r.choices[1].message  # the agent goes on with the second choice
        messages += [picked.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": picked.tool_calls[0].id,
                                                             "content": "5"}]
        await sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        await http.post(f"/v1/episodes/{ep['episode_id']}/reward", json={"reward": 1.0})
        traj = (await http.get(f"/v1/episodes/{ep['episode_id']}/trajectory")).json()
    first, second = traj["rows"]
    assert (first["calls"], second["calls"]) == (1, 2), "the continued choice's row grew"
    assert first["prompt_ids"] == second["prompt_ids"] == engine.prompts[0] == engine.prompts[1]
    assert first["completion_ids"] == engine.outputs[0]
    assert second["completion_ids"][: len(engine.outputs[1])] == engine.outputs[1]
    assert engine.prompts[2] == second["prompt_ids"] + second["completion_ids"][: -len(engine.outputs[2])]
    assert [kw.get("seed") for kw in engine.kwargs] == [7, 8, None], "choice i is seeded seed + i"


async def test_stop_sequences_logprobs_and_one_tool_call(chat: ChatFormat) -> None:
    two_calls = CALL + "\n" + CALL.replace("2 + 3", "4 * 5")
    service, engine = service_of(chat, ["The answer is 5.", "The answer is 5.", two_calls, two_calls])
    async with http_of(service) as http:
        ep = await new_episode(http)
        sdk = sdk_of(service, ep)
        q = [{"role": "user", "content": "What is 2 + 3?"}]
        r = await sdk.chat.completions.create(model="m", messages=q, stop=["is"], logprobs=True)
        assert r.choices[0].message.content == "The answer" and r.choices[0].finish_reason == "stop"
        kept = r.choices[0].logprobs.content
        assert chat.decode(engine.outputs[0][: len(kept)]).startswith("The answer is")
        assert len(kept) < len(engine.outputs[0]) and all(t.logprob == -0.5 for t in kept)
        assert "".join(t.token for t in kept).startswith("The answer is")
        r = await sdk.chat.completions.create(model="m", messages=q, stop="nowhere")
        assert r.choices[0].message.content == "The answer is 5." and r.choices[0].logprobs is None
        r = await sdk.chat.completions.create(model="m", messages=q, tools=TOOLS)
        assert len(r.choices[0].message.tool_calls) == 2
        r = await sdk.chat.completions.create(model="m", messages=q, tools=TOOLS, parallel_tool_calls=False)
        assert len(r.choices[0].message.tool_calls) == 1
        await http.post(f"/v1/episodes/{ep['episode_id']}/reward", json={"reward": 0.0})
        traj = (await http.get(f"/v1/episodes/{ep['episode_id']}/trajectory")).json()
    cut = traj["rows"][0]
    assert cut["completion_ids"] == engine.outputs[0][: len(kept)], "a prefix of what was sampled"


async def test_rewritten_history_starts_a_new_row(chat: ChatFormat) -> None:
    service, engine = service_of(chat, [CALL, "The answer is 5.", "The answer is 5."])
    async with http_of(service) as http:
        ep = await new_episode(http)
        sdk = sdk_of(service, ep)
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
    service, _ = service_of(chat, ["The answer is 5."] * 3)
    async with http_of(service) as http:
        ep = await new_episode(http)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        for key, status in (("nope", 401), (ep["api_key"] + "x", 401)):
            r = await http.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == status and r.json()["error"]["code"] == "unauthorized", r.text
        assert (await http.post("/v1/chat/completions", json=body, headers={"Authorization": ""})).status_code == 401
        own = {"Authorization": f"Bearer {ep['api_key']}"}
        assert (await http.post("/v1/episodes", headers=own)).status_code == 403  # an episode key cannot create
        for bad, words, param in (({**body, "top_logprobs": 2}, "logprobs=true", "top_logprobs"),
                                  ({**body, "stop": list("abcde")}, "at most 4", "stop"),
                                  ({**body, "tool_choice": "required"}, "needs tools", "tool_choice"),
                                  ({**body, "tools": TOOLS, "tool_choice": {"type": "function", "function": {
                                      "name": "search"}}}, "not among the tools", "tool_choice"),
                                  ({**body, "tools": TOOLS, "tool_choice": "always"}, "'required'", "tool_choice"),
                                  ({**body, "messages": [{"role": "robot", "content": "x"}]}, "role", None),
                                  ({**body, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
                                   "text parts", "messages"),
                                  ({**body, "tools": [{"type": "function"}]}, "tools[0]", "tools")):
            r = await http.post("/v1/chat/completions", json=bad, headers=own)
            assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
            assert r.json()["error"]["param"] == param, r.text
        r = await http.post("/v1/chat/completions", json={**body, "n": 17}, headers=own)
        assert r.status_code == 422 and "n:" in r.json()["error"]["message"], r.text
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
    service, _ = service_of(chat, ["x"], episode_ttl_s=0.2)
    async with http_of(service) as http:
        ep = await new_episode(http)
        await asyncio.sleep(0.3)
        r = await http.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                            headers={"Authorization": f"Bearer {ep['api_key']}"})
        assert r.status_code == 401 and "expired" in r.json()["error"]["message"]
        traj = (await http.get(f"/v1/episodes/{ep['episode_id']}/trajectory")).json()
    assert traj["status"] == "expired" and traj["reward"] is None and "TTL" in traj["error"]


async def test_a_disconnected_call_is_still_recorded_in_order(chat: ChatFormat) -> None:
    service, engine = service_of(chat, ["The answer is 5.", "Again 5."], delay=0.3)
    async with http_of(service) as http:
        ep = await new_episode(http)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        own = {"Authorization": f"Bearer {ep['api_key']}"}
        gone = asyncio.ensure_future(http.post("/v1/chat/completions", json=body, headers=own))
        await asyncio.sleep(0.1)
        gone.cancel()  # the client goes away mid-generation
        r = await http.post("/v1/chat/completions", json=body, headers=own)  # its retry waits for the first
        assert r.status_code == 200
        traj = (await http.get(f"/v1/episodes/{ep['episode_id']}/trajectory")).json()
    assert traj["calls"] == 2 and [row["completion_ids"] for row in traj["rows"]] == engine.outputs


async def test_a_forced_tool_call_is_the_templates_opening_continued_by_the_model(chat: ChatFormat) -> None:
    """``tool_choice`` naming a function (or ``required``) appends the template's opening of such a call to
    the prompt; the model samples the rest. The opening is context in the row (mask 0), never trained."""
    named, required = chat.call_opening(TOOLS, "calculate"), chat.call_opening(TOOLS, None)
    assert CALL.startswith(named) and named.endswith('"arguments":') and '"calculate"' in named
    assert CALL.startswith(required) and required.endswith('"name":')
    service, engine = service_of(chat, [CALL[len(named):], CALL[len(required):], "The answer is 5."])
    async with http_of(service) as http:
        ep = await new_episode(http)
        sdk = sdk_of(service, ep)
        messages: list[Any] = [{"role": "user", "content": "What is 2 + 3?"}]
        for choice in ({"type": "function", "function": {"name": "calculate"}}, "required"):
            r = await sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS, tool_choice=choice)
            (call,) = r.choices[0].message.tool_calls
            assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "calculate", choice
            assert json.loads(call.function.arguments) == {"expression": "2 + 3"}
            messages += [r.choices[0].message.model_dump(), {"role": "tool", "tool_call_id": call.id, "content": "5"}]
        r = await sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS, tool_choice="auto")
        assert r.choices[0].message.content == "The answer is 5."
        await http.post(f"/v1/episodes/{ep['episode_id']}/reward", json={"reward": 1.0})
        (row,) = (await http.get(f"/v1/episodes/{ep['episode_id']}/trajectory")).json()["rows"]
    assert engine.prompts[0] == chat.prompt_ids(messages[:1], TOOLS) + chat.encode(named)
    assert engine.prompts[1][-len(chat.encode(required)):] == chat.encode(required)
    assert row["calls"] == 3 and row["prompt_ids"] + row["completion_ids"] == engine.prompts[2] + engine.outputs[2]
    assert [t for t, m in zip(row["completion_ids"], row["loss_mask"], strict=True) if m] == [t for out in engine.outputs for t in out]


async def test_top_logprobs_name_the_alternatives_of_each_kept_token(chat: ChatFormat) -> None:
    service, engine = service_of(chat, ["The answer is 5."])
    async with http_of(service) as http:
        sdk = sdk_of(service, await new_episode(http))
        r = await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "What is 2 + 3?"}],
                                              logprobs=True, top_logprobs=3)
    assert engine.kwargs[0]["top_logprobs"] == 3
    content = r.choices[0].logprobs.content
    assert len(content) == len(engine.outputs[0]) and all(len(t.top_logprobs) == 3 for t in content)
    for t, token_id in zip(content, engine.outputs[0], strict=True):
        assert t.top_logprobs[0].token == t.token == chat.decode([token_id]) and t.top_logprobs[0].logprob == -0.5
        assert [a.logprob for a in t.top_logprobs] == [-0.5, -1.5, -2.5]


async def test_truncated_sampling_records_a_kept_set_per_sampled_token_in_the_row(chat: ChatFormat) -> None:
    """Training pins the run's sampling: every call samples at top-k 3 whatever the request says, the engine's
    kept sets are recorded over the row's sampled ids (count 0 on the template's delta), and the recorded
    trajectory carries them."""
    from agentrl.core.masks import SamplingMask

    service, engine = service_of(chat, [CALL, "The answer is 5."], temperature=1.0, top_k=3, sampling_masks=True)
    async with http_of(service) as http:
        ep = await new_episode(http)
        sdk = sdk_of(service, ep)
        messages: list[Any] = [{"role": "user", "content": "What is 2 + 3?"}]
        r = await sdk.chat.completions.create(model="any", messages=messages, tools=TOOLS, top_p=0.5)
        call = r.choices[0].message.tool_calls[0]
        messages += [r.choices[0].message.model_dump(exclude_none=False),
                     {"role": "tool", "tool_call_id": call.id, "content": "5"}]
        await sdk.chat.completions.create(model="any", messages=messages, tools=TOOLS)
        traj = (await http.get(f"/v1/episodes/{ep['episode_id']}/trajectory")).json()
    assert all(kw["top_k"] == 3 and kw["top_p"] == 1.0 and kw["sampling_mask"] for kw in engine.kwargs)
    (row,) = traj["rows"]
    mask = SamplingMask.model_validate(row["sampling_mask"])
    assert mask.n == len(row["completion_ids"])
    for t, (tok, m) in enumerate(zip(row["completion_ids"], row["loss_mask"], strict=True)):
        assert (mask.counts[t] == 3 and mask.row(t)[tok]) if m else mask.counts[t] == 0
    plain, engine = service_of(chat, [CALL])  # an endpoint that does not pin sampling records none
    async with http_of(plain) as http:
        ep = await new_episode(http)
        await sdk_of(plain, ep).chat.completions.create(model="any", messages=messages[:1], tools=TOOLS, top_p=0.5)
        (row,) = (await http.get(f"/v1/episodes/{ep['episode_id']}/trajectory")).json()["rows"]
    assert "sampling_mask" not in row and engine.kwargs[0]["top_p"] == 0.5 and "sampling_mask" not in engine.kwargs[0]
