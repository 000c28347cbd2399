"""The Responses API of the policy endpoint with a scripted engine: the stock ``openai`` client, streamed and
not, with the whole input replayed or chained by ``previous_response_id``, records the rows of the same
conversation sent as chat completions; what it cannot honour is refused naming the parameter."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from agentrl.rollout.chat import ChatFormat
from tests.unit.http.policy.scripted import (
    CALL,
    TOOLS,
    http_of,
    in_process,
    new_episode,
    scripted_chat,
    sdk_of,
    service_of,
)

RESPONSES_TOOLS: list[Any] = [{"type": "function", "name": t["function"]["name"],
                               "description": t["function"]["description"],
                               "parameters": t["function"]["parameters"], "strict": False} for t in TOOLS]
KEYS = ("prompt_ids", "completion_ids", "loss_mask", "logprobs", "versions", "calls")


@pytest.fixture(scope="module")
def chat() -> ChatFormat:
    return scripted_chat()


async def _create(sdk: openai.AsyncOpenAI, stream: bool, **kw: Any) -> Any:
    """One ``responses.create``; streamed, the ``response.completed`` event's response (after checking that
    the deltas spell out its output)."""
    if not stream:
        return await sdk.responses.create(model="m", **kw)
    text, args, done = "", "", None
    kinds = []
    async for event in await sdk.responses.create(model="m", stream=True, **kw):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        elif event.type == "response.function_call_arguments.delta":
            args += event.delta
        elif event.type in ("response.completed", "response.incomplete"):
            done = event.response
    assert kinds[:2] == ["response.created", "response.in_progress"] and done is not None, kinds
    assert text == "".join(c.text for o in done.output if o.type == "message" for c in o.content)
    assert args == "".join(o.arguments for o in done.output if o.type == "function_call")
    return done


async def _episode(chat: ChatFormat, stream: bool, chained: bool) -> tuple[dict[str, Any], Any]:
    """The calc tool loop through the Responses API: the trajectory and the last response."""
    service, _ = service_of(chat, [CALL, "The answer is 5."])
    async with http_of(service) as http:
        ep = await new_episode(http)
        sdk = sdk_of(service, ep)
        items: list[Any] = [{"role": "user", "content": "What is 2 + 3?"}]
        first = await _create(sdk, stream, instructions="Use the tool.", input=items, tools=RESPONSES_TOOLS)
        (call,) = [o for o in first.output if o.type == "function_call"]
        assert call.name == "calculate" and json.loads(call.arguments) == {"expression": "2 + 3"}
        result = {"type": "function_call_output", "call_id": call.call_id, "output": "5"}
        if chained:
            second = await _create(sdk, stream, instructions="Use the tool.", input=[result], tools=RESPONSES_TOOLS,
                                   previous_response_id=first.id)
        else:
            replay = items + [o.model_dump(exclude_none=True) for o in first.output] + [result]
            second = await _create(sdk, stream, instructions="Use the tool.", input=replay, tools=RESPONSES_TOOLS)
        assert second.output_text == "The answer is 5." and second.status == "completed"
        assert second.usage.input_tokens > 0 and second.usage.output_tokens > 0
        return (await http.get(f"/v1/episodes/{ep['episode_id']}/trajectory")).json(), second


async def _chat_episode(chat: ChatFormat) -> dict[str, Any]:
    """The same conversation as chat completions."""
    service, _ = service_of(chat, [CALL, "The answer is 5."])
    async with http_of(service) as http:
        ep = await new_episode(http)
        sdk = sdk_of(service, ep)
        messages: list[Any] = [{"role": "system", "content": "Use the tool."}, {"role": "user", "content": "What is 2 + 3?"}]
        msg = (await sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS)).choices[0].message
        assert msg.tool_calls
        messages += [msg.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "5"}]
        await sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        return (await http.get(f"/v1/episodes/{ep['episode_id']}/trajectory")).json()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("chained", [False, True], ids=["replayed", "previous_response_id"])
async def test_a_responses_tool_loop_records_the_rows_of_chat_completions(chat: ChatFormat, stream: bool,
                                                                          chained: bool) -> None:
    traj, _ = await _episode(chat, stream, chained)
    reference = await _chat_episode(chat)
    assert [r["calls"] for r in traj["rows"]] == [2], "both calls are one row"
    assert [{k: r[k] for k in KEYS} for r in traj["rows"]] == [{k: r[k] for k in KEYS} for r in reference["rows"]]


async def test_refusals_name_the_parameter_and_unknown_ids_are_404(chat: ChatFormat) -> None:
    service, _ = service_of(chat, ["The answer is 5."] * 4)
    async with http_of(service) as http:
        ep = await new_episode(http)
        sdk = sdk_of(service, ep)
        cases: list[tuple[dict[str, Any], str]] = [
            ({"tools": [{"type": "web_search"}]}, "tools"),
            ({"tool_choice": {"type": "function", "name": "search"}, "tools": RESPONSES_TOOLS}, "tool_choice"),
            ({"tool_choice": {"type": "allowed_tools", "tools": []}, "tools": RESPONSES_TOOLS}, "tool_choice"),
            ({"text": {"format": {"type": "json_object"}}}, "text.format"),
            ({"conversation": "conv_1"}, "conversation"),
            ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
            ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content"),
        ]
        for extra, param in cases:
            body = {"input": "What is 2 + 3?", **extra}
            with pytest.raises(openai.BadRequestError) as err:
                await sdk.responses.create(model="m", **body)
            assert err.value.param == param, (extra, err.value.body)
        with pytest.raises(openai.NotFoundError, match="previous response 'resp_nope' not found"):
            await sdk.responses.create(model="m", input="hi", previous_response_id="resp_nope")
        ok = await sdk.responses.create(model="m", input="What is 2 + 3?", max_output_tokens=64)
        assert ok.output_text == "The answer is 5." and ok.previous_response_id is None
        # another caller cannot chain on this episode's response
        other = sdk_of(service, await new_episode(http))
        with pytest.raises(openai.NotFoundError):
            await other.responses.create(model="m", input="hi", previous_response_id=ok.id)


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
async def test_the_openai_agents_sdk_runs_a_tool_episode_as_one_row(chat: ChatFormat, api: str) -> None:
    agents = pytest.importorskip("agents", reason="openai-agents is not installed (pip install 'agentrl[dev]')")
    agents.set_tracing_disabled(True)  # nothing leaves this process
    service, engine = service_of(chat, [CALL, "The answer is 5."])
    async with http_of(service) as http:
        ep = await new_episode(http)
        client = sdk_of(service, ep)
        model = (agents.OpenAIResponsesModel if api == "responses" else agents.OpenAIChatCompletionsModel)(
            model="policy", openai_client=client)
        calls = []

        @agents.function_tool
        def calculate(expression: str) -> str:
            """Evaluate an arithmetic expression."""
            calls.append(expression)
            return "5"

        agent = agents.Agent(name="calc", instructions="Use the tool.", tools=[calculate], model=model)
        for stream in (False, True):
            engine.texts = [CALL, "The answer is 5."]
            if stream:
                run = agents.Runner.run_streamed(agent, "What is 2 + 3?", max_turns=4)
                async for _ in run.stream_events():
                    pass
            else:
                run = await agents.Runner.run(agent, "What is 2 + 3?", max_turns=4)
            assert run.final_output == "The answer is 5." and calls[-1] == "2 + 3"
        traj = (await http.get(f"/v1/episodes/{ep['episode_id']}/trajectory")).json()
    # each run is one row of two calls: the second call extends the first (the SDK replays the items)
    assert [r["calls"] for r in traj["rows"]] == [2, 2]
    assert traj["rows"][0]["prompt_ids"] == traj["rows"][1]["prompt_ids"]
    assert traj["rows"][0]["completion_ids"] == traj["rows"][1]["completion_ids"]


async def test_a_langchain_tool_calling_agent_runs_a_tool_episode_as_one_row(chat: ChatFormat) -> None:
    pytest.importorskip("langchain_openai", reason="langchain-openai is not installed (pip install 'agentrl[dev]')")
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    service, _ = service_of(chat, [CALL, "The answer is 5."])
    async with http_of(service) as http:
        ep = await new_episode(http)

        @tool
        def calculate(expression: str) -> str:
            """Evaluate an arithmetic expression."""
            return "5"

        llm = ChatOpenAI(model="policy", base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0,
                         http_async_client=in_process(service)).bind_tools([calculate])
        messages: list[Any] = [SystemMessage("Use the tool."), HumanMessage("What is 2 + 3?")]
        for _ in range(3):
            ai = await llm.ainvoke(messages)
            messages.append(ai)
            if not ai.tool_calls:
                break
            for call in ai.tool_calls:
                messages.append(ToolMessage(calculate.invoke(call["args"]), tool_call_id=call["id"]))
        assert messages[-1].content == "The answer is 5." and len(messages) == 5
        traj = (await http.get(f"/v1/episodes/{ep['episode_id']}/trajectory")).json()
    assert [r["calls"] for r in traj["rows"]] == [2]


BAD_BODIES: list[dict[str, Any]] = [
    {"input": [1]}, {"input": None}, {"input": []}, {}, {"input": "hi", "text": "x"}, {"input": "hi", "tools": [5]},
    {"input": [{"type": "message", "role": "user", "content": 5}]}, {"input": [{"role": "tool", "content": "x"}]},
    {"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, {"input": "hi", "text": {"format": "json"}},
    {"input": "hi", "tools": [{"type": "function"}]}, {"input": [{"type": "function_call", "call_id": 1, "name": "x"}]},
    {"input": [{"type": "function_call", "call_id": "c", "name": "calculate", "arguments": "{bad"}]},
    {"input": [{"type": "function_call", "call_id": "c", "name": "calculate", "arguments": 7}]},
    {"input": [{"type": "function_call_output"}]}, {"input": "hi", "max_output_tokens": 0},
    {"input": "hi", "instructions": 5},
]


async def test_malformed_bodies_are_clear_4xx_errors(chat: ChatFormat) -> None:
    service, _ = service_of(chat, [])
    async with http_of(service) as http:
        ep = await new_episode(http)
        for body in BAD_BODIES:
            r = await http.post("/v1/responses", json={"model": "m", **body},
                                headers={"Authorization": f"Bearer {ep['api_key']}"})
            assert r.status_code in (400, 422) and r.json()["error"]["message"], (body, r.status_code, r.text)
        assert service.calls == 0
