"""The policy endpoint on the session vLLM server, driven by the `openai` SDK over real HTTP: a tool-calling
agent's episode is one token-faithful row, a history-rewriting agent's episode is several, each the ids the
engine saw; a call in flight across a weight update keeps its prefix and carries two versions."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
import torch

from agentrl.config.policy import PolicyConfig
from agentrl.envs.calc import CalcEnv, safe_eval
from agentrl.http.policy.run import serving
from agentrl.http.policy.service import PolicyService
from agentrl.inference import InferenceClient
from agentrl.inference.client import Generation
from agentrl.orchestrator.loop import live_update
from agentrl.rollout.chat import ChatFormat
from agentrl.tools.bench.models import lora_shapes, random_lora, save_lora
from agentrl.weight_sync.shm import SharedMemoryAdapterSync
from tests.integration.vllm_metrics import start_paused_mid_generation

pytestmark = pytest.mark.integration

TOKEN = "policy-test-token-0123456789"


class Recording:
    """A real client that records every (prompt, generation) pair the engine served."""

    def __init__(self, inner: InferenceClient, **forced: Any) -> None:
        self.inner, self.forced = inner, forced
        self.calls: list[tuple[list[int], Generation]] = []

    async def generate(self, prompt_ids: list[int], **kw: Any) -> Generation:
        gen = await self.inner.generate(prompt_ids, **{**kw, **self.forced})
        self.calls.append((list(prompt_ids), gen))
        return gen


@pytest.fixture(scope="module")
def chat(tiny_model_dir: Path) -> ChatFormat:
    from transformers import AutoTokenizer

    return ChatFormat(AutoTokenizer.from_pretrained(tiny_model_dir))


async def _episode(url: str) -> dict[str, Any]:
    import httpx

    async with httpx.AsyncClient(timeout=10) as h:
        r = await h.post(f"{url}/v1/episodes", json={"task_id": "t"}, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 201, r.text
        return r.json()


async def _trajectory(url: str, ep: dict[str, Any], reward: float) -> dict[str, Any]:
    import httpx

    auth = {"Authorization": f"Bearer {ep['api_key']}"}
    async with httpx.AsyncClient(timeout=10) as h:
        assert (await h.post(f"{url}/v1/episodes/{ep['episode_id']}/reward", json={"reward": reward}, headers=auth)).status_code == 200
        return (await h.get(f"{url}/v1/episodes/{ep['episode_id']}/trajectory", headers=auth)).json()


def _sampled_versions(row: dict[str, Any]) -> list[int]:
    """The policy versions of the row's sampled (mask-1) tokens."""
    return [v for v, m in zip(row["versions"], row["loss_mask"], strict=True) if m]


def _check_row(row: dict[str, Any], calls: list[tuple[list[int], Generation]]) -> None:
    """A row is the ids the engine saw: its calls' prompts extend each other by the sampled ids, its last
    prompt plus the last output is the whole row, and the mask-1 tokens are exactly the engine's outputs."""
    for (p0, g0), (p1, _) in itertools.pairwise(calls):
        assert p1[: len(p0) + len(g0.token_ids)] == p0 + g0.token_ids
    assert row["prompt_ids"] == calls[0][0]
    assert row["prompt_ids"] + row["completion_ids"] == calls[-1][0] + calls[-1][1].token_ids
    mask = row["loss_mask"]
    assert [t for t, m in zip(row["completion_ids"], mask, strict=True) if m] == [t for _, g in calls for t in g.token_ids]
    assert [lp for lp, m in zip(row["logprobs"], mask, strict=True) if m] == pytest.approx([lp for _, g in calls for lp in g.logprobs])
    assert len(row["versions"]) == len(mask) and all(v == -1 for v, m in zip(row["versions"], mask, strict=True) if not m)


async def _tool_loop(sdk: openai.AsyncOpenAI, messages: list[Any], *, rewrite: bool) -> list[Any]:
    """Calc's question with a calculator tool, 4 turns at most; ``rewrite``: after each tool result the
    agent replaces its history with one user message that summarises it (a new row each time)."""
    tools = CalcEnv.tool_schemas()
    for _ in range(4):
        r = await sdk.chat.completions.create(model="policy", messages=messages, tools=tools, temperature=0.0,
                                              max_tokens=64)
        msg = r.choices[0].message
        if not msg.tool_calls:
            return [*messages, msg.model_dump()]
        results = []
        for call in msg.tool_calls:
            try:
                out = str(safe_eval(json.loads(call.function.arguments).get("expression", "")))
            except Exception as e:
                out = f"error: {e}"
            results.append({"role": "tool", "tool_call_id": call.id, "content": out})
        if rewrite:
            messages = [messages[0], {"role": "user", "content": f"{messages[1]['content']} (calculator said: "
                                                                 f"{results[-1]['content']})"}]
        else:
            messages = [*messages, msg.model_dump(), *results]
    return messages


async def test_sdk_agents_record_token_faithful_rows(vllm_server, chat: ChatFormat) -> None:
    async with InferenceClient([vllm_server.url]) as client:
        await client.set_weight_version("0")  # the session server is shared: other tests relabel it
        rec = Recording(client)
        service = PolicyService(PolicyConfig(port=0, token=TOKEN, max_context_tokens=1024), rec, chat)
        async with serving(service, TOKEN) as url:
            rows_seen = {False: 0, True: 0}
            for rewrite in (False, True):
                for task in CalcEnv.tasks("test")[:6]:
                    ep = await _episode(url)
                    sdk = openai.AsyncOpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0, timeout=120)
                    rec.calls.clear()
                    opening = [{"role": "system", "content": CalcEnv.system_prompt}, {"role": "user", "content": task["question"]}]
                    await _tool_loop(sdk, opening, rewrite=rewrite)
                    traj = await _trajectory(url, ep, 1.0)
                    assert traj["calls"] == len(rec.calls) and traj["status"] == "ended"
                    calls = list(rec.calls)
                    for row in traj["rows"]:
                        _check_row(row, calls[: row["calls"]])
                        assert row["reward"] == 1.0 and set(_sampled_versions(row)) == {0}
                        calls = calls[row["calls"]:]
                    assert not calls
                    rows_seen[rewrite] = max(rows_seen[rewrite], len(traj["rows"]))
                    if not rewrite:
                        assert len(traj["rows"]) == 1, "a history that only grows is one row"
                    await sdk.close()
            assert rows_seen[True] > 1, "the warmed-up tiny model should call the calculator at least once"
            async with openai.AsyncOpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0) as sdk:
                with pytest.raises(openai.AuthenticationError, match="expired"):  # the episode is over
                    await sdk.chat.completions.create(model="policy", messages=opening)


async def _seeded_turns(sdk: openai.AsyncOpenAI, question: str, *, stream: bool) -> None:
    """Up to three seeded turns of the calc tool loop at temperature 1, streamed or not."""
    messages: list[Any] = [{"role": "system", "content": CalcEnv.system_prompt}, {"role": "user", "content": question}]
    for turn in range(3):
        kw: dict[str, Any] = {"model": "policy", "messages": messages, "tools": CalcEnv.tool_schemas(),
                              "temperature": 1.0, "max_tokens": 64, "seed": 100 + turn}
        if stream:
            content, calls = "", {}
            async for chunk in await sdk.chat.completions.create(**kw, stream=True):
                delta = chunk.choices[0].delta
                content += delta.content or ""
                for c in delta.tool_calls or []:
                    calls[c.index] = {"id": c.id, "type": "function",
                                      "function": {"name": c.function.name, "arguments": c.function.arguments}}
            msg: dict[str, Any] = {"role": "assistant", "content": content or None,
                                   **({"tool_calls": [calls[k] for k in sorted(calls)]} if calls else {})}
        else:
            msg = (await sdk.chat.completions.create(**kw)).choices[0].message.model_dump(exclude_none=True)
        messages.append(msg)
        if not msg.get("tool_calls"):
            return
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "42"} for c in msg["tool_calls"]]


async def test_streamed_and_n_choices_record_token_faithful_rows(vllm_server, chat: ChatFormat) -> None:
    """Seeded sampling makes a streamed episode and an unstreamed one sample the same ids: their rows are
    identical. ``n = 2`` records two rows, each exactly what the engine returned."""
    async with InferenceClient([vllm_server.url]) as client:
        await client.set_weight_version("0")
        rec = Recording(client)
        service = PolicyService(PolicyConfig(port=0, token=TOKEN, max_context_tokens=1024), rec, chat)
        async with serving(service, TOKEN) as url:
            question = CalcEnv.tasks("test")[0]["question"]
            rows = {}
            for stream in (False, True):
                ep = await _episode(url)
                async with openai.AsyncOpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0,
                                              timeout=120) as sdk:
                    await _seeded_turns(sdk, question, stream=stream)
                rows[stream] = (await _trajectory(url, ep, 1.0))["rows"]
            keys = ("prompt_ids", "completion_ids", "loss_mask", "versions")
            assert [{k: r[k] for k in keys} for r in rows[True]] == [{k: r[k] for k in keys} for r in rows[False]]
            assert rows[True][0]["logprobs"] == pytest.approx(rows[False][0]["logprobs"], abs=1e-4)
            ep = await _episode(url)
            rec.calls.clear()
            async with openai.AsyncOpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0,
                                          timeout=120) as sdk:
                r = await sdk.chat.completions.create(
                    model="policy", messages=[{"role": "user", "content": question}], n=2, max_tokens=32,
                    temperature=1.0, seed=5, logprobs=True)
            assert len(r.choices) == 2 and len(rec.calls) == 2
            traj = await _trajectory(url, ep, 0.0)
            assert len(traj["rows"]) == 2
            outputs = sorted(tuple(g.token_ids) for _, g in rec.calls)
            assert sorted(tuple(row["completion_ids"]) for row in traj["rows"]) == outputs
            for choice in r.choices:
                assert len(choice.logprobs.content) > 0 and all(t.logprob <= 0.0 for t in choice.logprobs.content)


async def test_a_stream_arrives_token_by_token_from_the_engine(vllm_server, chat: ChatFormat) -> None:
    """A streamed call is streamed by the engine too: its text comes in many chunks while the turn is sampled,
    through the endpoint on its own event loop (as a training run serves it), and adds up to the unstreamed
    answer of the same greedy call; both record the same row."""
    from agentrl.http.policy.thread import EndpointThread, LoopGenerator

    question = "Write one long sentence about the number seven."
    async with InferenceClient([vllm_server.url]) as client:
        await client.set_weight_version("0")
        rec = Recording(client, ignore_eos=True)  # no early end of sequence: the turn has text to stream
        service = PolicyService(PolicyConfig(port=0, token=TOKEN, max_context_tokens=1024),
                                LoopGenerator(rec, asyncio.get_running_loop()), chat)
        async with EndpointThread(service).serving(TOKEN) as url:
            rows, texts, pieces = {}, {}, 0
            for stream in (False, True):
                ep = await _episode(url)
                async with openai.AsyncOpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0,
                                              timeout=120) as sdk:
                    kw: dict[str, Any] = {"model": "policy", "messages": [{"role": "user", "content": question}],
                                          "temperature": 0.0, "max_tokens": 24}
                    if stream:
                        deltas = [c.choices[0].delta.content async for c in await sdk.chat.completions.create(
                            **kw, stream=True) if c.choices and c.choices[0].delta.content]
                        texts[stream], pieces = "".join(deltas), len(deltas)
                    else:
                        texts[stream] = (await sdk.chat.completions.create(**kw)).choices[0].message.content
                rows[stream] = (await _trajectory(url, ep, 1.0))["rows"]
    keys = ("prompt_ids", "completion_ids", "loss_mask", "versions")
    assert [{k: r[k] for k in keys} for r in rows[True]] == [{k: r[k] for k in keys} for r in rows[False]]
    assert texts[True] == texts[False] and len(rows[True][0]["completion_ids"]) > 8
    assert pieces > 3, f"the text came in {pieces} pieces: it was not streamed as it was sampled"


async def test_a_forced_tool_call_and_top_logprobs_on_the_engine(vllm_server, chat: ChatFormat) -> None:
    """A named ``tool_choice``: the engine is sent the prompt plus the template's opening of that call and
    continues it (greedy, so what it writes is fixed by the model); the row keeps the opening as context.
    ``top_logprobs`` are the engine's: ranked, and the greedy pick first."""
    tools = CalcEnv.tool_schemas()
    name = tools[0]["function"]["name"]
    messages: list[Any] = [{"role": "system", "content": CalcEnv.system_prompt},
                           {"role": "user", "content": CalcEnv.tasks("test")[0]["question"]}]
    async with InferenceClient([vllm_server.url]) as client:
        await client.set_weight_version("0")
        rec = Recording(client)
        service = PolicyService(PolicyConfig(port=0, token=TOKEN, max_context_tokens=1024), rec, chat)
        async with serving(service, TOKEN) as url:
            ep = await _episode(url)
            async with openai.AsyncOpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0,
                                          timeout=120) as sdk:
                r = await sdk.chat.completions.create(
                    model="policy", messages=messages, tools=tools, temperature=0.0, max_tokens=64,
                    tool_choice={"type": "function", "function": {"name": name}}, logprobs=True, top_logprobs=3)
            (row,) = (await _trajectory(url, ep, 0.0))["rows"]
    ((prompt, gen),) = rec.calls
    opening = chat.call_opening(tools, name)
    assert prompt == chat.prompt_ids(messages, tools) + chat.encode(opening) == row["prompt_ids"]
    assert row["completion_ids"] == gen.token_ids and set(row["loss_mask"]) == {1}
    (call,) = r.choices[0].message.tool_calls or [None]
    assert call is not None and call.function.name == name, (opening, chat.decode(gen.token_ids))
    assert isinstance(json.loads(call.function.arguments), dict)
    for t in r.choices[0].logprobs.content:
        ranked = [a.logprob for a in t.top_logprobs]
        assert len(ranked) == 3 and ranked == sorted(ranked, reverse=True), t
        assert t.top_logprobs[0].token == t.token, "greedy: the sampled token is the most likely one"


async def test_a_call_across_a_weight_update_keeps_its_prefix(vllm_server, chat: ChatFormat, tmp_path: Path) -> None:
    name, total = "policy-partial", 700
    shapes = lora_shapes("tiny", 16)
    base = {n: (torch.zeros(s) if "lora_B" in n else torch.randn(s) * 0.1) for n, s in shapes.items()}

    class _Trainer:
        tensors = base

        async def get_adapter_tensors(self) -> dict[str, torch.Tensor]:
            return self.tensors

    trainer = _Trainer()
    async with InferenceClient([vllm_server.url], timeout_s=300) as client:
        await client.load_lora_adapter(name, str(save_lora(tmp_path / "v0", base)))
        await client.set_weight_version("0")
        version = {"v": 0}
        # a run's policy version; no EOS and no stop tokens make the generation run to its budget, so it can be
        # caught mid-way whatever the model's weights (a tiny model built elsewhere may end its turn at once)
        service = PolicyService(PolicyConfig(port=0, token=TOKEN, max_tokens_per_call=total, max_context_tokens=1024),
                                Recording(client, ignore_eos=True, stop_token_ids=[]), chat, model=name,
                                policy_version=lambda: version["v"])
        async with serving(service, TOKEN) as url:
            ep = await _episode(url)
            sdk = openai.AsyncOpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0, timeout=300)
            messages = [{"role": "user", "content": "Count."}]

            async def call() -> Any:
                return await sdk.chat.completions.create(model="policy", messages=messages, temperature=0.0,
                                                         max_tokens=total)

            with SharedMemoryAdapterSync(trainer, client, name, reset="") as sync:
                trainer.tensors = random_lora(shapes, seed=7, std=0.5)
                try:
                    running = await start_paused_mid_generation(client, vllm_server.url, call, first=8, total=total)
                    await live_update(client, sync, 1, paused=True, mode="keep")
                    version["v"] = 1
                finally:
                    await client.resume()
                await running
            traj = await _trajectory(url, ep, 0.0)
            await sdk.close()
        await client.unload_lora_adapter(name)
    assert len(traj["rows"]) == 1
    versions = _sampled_versions(traj["rows"][0])
    assert len(versions) == total and 1 in versions and versions[0] == 0
    k = versions.index(1)
    assert versions == [0] * k + [1] * (total - k), "one v0 span (the kept prefix), then one v1 span"



def _start_serve_policy(engine: str, model: Path) -> tuple[subprocess.Popen, str]:
    """`agentrl serve-policy` in its own process group, and the URL it prints once it serves."""
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "serve-policy", "--endpoint", engine,
                             "--model", str(model), "--port", "0", "--token", TOKEN],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, start_new_session=True)
    lines = []
    for line in proc.stderr:  # type: ignore[union-attr]
        lines.append(line)
        if (found := re.search(r"policy endpoint: (http://\S+)/v1", line)):
            return proc, found.group(1)
    proc.wait(timeout=30)
    raise AssertionError("agentrl serve-policy stopped before serving:\n" + "".join(lines))


async def test_serve_policy_command(vllm_server, tiny_model_dir: Path) -> None:
    """`agentrl serve-policy --endpoint URL --port 0` serves episodes until SIGTERM, then exits 0."""
    import httpx

    proc, url = _start_serve_policy(vllm_server.url, tiny_model_dir)
    try:
        ep = await _episode(url)
        async with openai.AsyncOpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0, timeout=120) as sdk:
            r = await sdk.chat.completions.create(model="x", messages=[{"role": "user", "content": "What is 2 + 2?"}],
                                                  max_tokens=8)
        assert r.usage.completion_tokens == len(
            (await _trajectory(url, ep, 0.0))["rows"][0]["completion_ids"]) > 0
        async with httpx.AsyncClient(timeout=10) as h:
            assert (await h.get(f"{url}/v1/models", headers={"Authorization": "Bearer wrong"})).status_code == 401
        os.killpg(proc.pid, signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
