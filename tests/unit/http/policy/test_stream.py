"""Chat completions streamed token by token: the text arrives as it is sampled, never a byte of a tool call or
of a stop sequence, and the recorded row and the final message are those of the same call unstreamed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrl.http.policy.stream import DeltaText
from agentrl.rollout.chat import ChatFormat
from tests.unit.http.policy.scripted import CALL, TOOLS, http_of, new_episode, scripted_chat, service_of

KEYS = ("prompt_ids", "completion_ids", "loss_mask", "logprobs", "versions")


@pytest.fixture(scope="module")
def chat() -> ChatFormat:
    return scripted_chat()


def test_delta_text_holds_back_markers_whitespace_and_half_characters() -> None:
    d = DeltaText(["<tool_call>", "STOP"])
    assert d.update("  Hel") == "Hel"
    assert d.update("  Hello ") == "lo"  # trailing whitespace waits: the answer may end there
    assert d.update("  Hello wor") == " wor"
    assert d.update("  Hello world <tool") == "ld"  # could be the start of a call
    assert d.update("  Hello world <tool_call>\n{") == "" and d.frozen
    assert d.update("  Hello world <tool_call>\n{ more") == "" and d.sent == "Hello world"
    h = DeltaText(["STOP"])
    assert h.update("caf\ufffd") == "caf" and h.update("café ST") == "é" and h.update("café STOP!") == ""
    assert h.sent == "café"


async def _call(chat: ChatFormat, text: str, stream: bool, live: bool | None = None,
                **body: Any) -> tuple[list[str], dict[str, Any], Any]:
    """One recorded call answered with ``text``: the content deltas (streamed) or the whole content, the final
    message and the row. ``live``: whether the engine must have streamed (default: ``stream``)."""
    service, engine = service_of(chat, [text])
    async with http_of(service) as http:
        ep = await new_episode(http)
        req = {"model": "m", "messages": [{"role": "user", "content": "What is 2 + 3?"}], "stream": stream, **body}
        key = {"Authorization": f"Bearer {ep['api_key']}"}
        r = await http.post("/v1/chat/completions", json=req, headers=key)
        assert r.status_code == 200, r.text
        deltas: list[str] = []
        message: dict[str, Any] = {"content": "", "tool_calls": []}
        finish = None
        if stream:
            for line in r.text.splitlines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for ch in json.loads(line[6:])["choices"]:
                    delta = ch["delta"]
                    if delta.get("content"):
                        deltas.append(delta["content"])
                    message["tool_calls"] += delta.get("tool_calls") or []
                    finish = ch["finish_reason"] or finish
            message["content"] = "".join(deltas)
        else:
            choice = r.json()["choices"][0]
            message = {"content": choice["message"]["content"] or "", "tool_calls": choice["message"].get("tool_calls") or []}
            finish = choice["finish_reason"]
        message["finish_reason"] = finish
        row = (await http.get(f"/v1/episodes/{ep['episode_id']}/trajectory")).json()["rows"][0]
        assert engine.streamed is (stream if live is None else live)
        return deltas, message, {k: row[k] for k in KEYS}


@pytest.mark.parametrize(("text", "body"), [
    ("The answer is 5, and here is why: two plus three.", {}),
    ("The answer is 5. STOP and more text", {"stop": ["STOP"]}),
    ("Let me compute it. " + CALL, {"tools": TOOLS}),
    ("The answer is 5.", {"tools": TOOLS}),
])
async def test_a_live_stream_sends_the_text_as_sampled_and_records_the_unstreamed_row(
        chat: ChatFormat, text: str, body: dict[str, Any]) -> None:
    deltas, streamed, streamed_row = await _call(chat, text, True, **body)
    _, plain, plain_row = await _call(chat, text, False, **body)
    assert streamed_row == plain_row
    assert streamed["content"] == plain["content"] and streamed["finish_reason"] == plain["finish_reason"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in streamed["tool_calls"]] == \
           [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in plain["tool_calls"]]
    assert len(deltas) > 3, "the text came in one piece, not as it was sampled"
    assert not any("<tool_call>" in d or "STOP" in d for d in deltas)


async def test_calls_that_cannot_stream_live_are_sent_whole(chat: ChatFormat) -> None:
    deltas, message, _ = await _call(chat, "The answer is 5.", True, live=False, logprobs=True)
    assert deltas == ["The answer is 5."] and message["finish_reason"] == "stop"


async def test_a_bad_streamed_request_is_answered_with_its_status(chat: ChatFormat) -> None:
    service, _ = service_of(chat, ["x"], max_context_tokens=16)
    async with http_of(service) as http:
        ep = await new_episode(http)
        r = await http.post("/v1/chat/completions", headers={"Authorization": f"Bearer {ep['api_key']}"},
                            json={"model": "m", "stream": True,
                                  "messages": [{"role": "user", "content": "What is 2 + 3? " * 20}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
