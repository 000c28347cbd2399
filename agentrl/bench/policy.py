"""The policy endpoint's cost: the same calls sent straight to the engine (token ids in, ids out) and through
the endpoint with the ``openai`` SDK (render, HTTP, parse, record), side by side in one run.

Every call generates exactly ``--tokens`` tokens (greedy, end-of-turn ignored) from calc's opening prompts,
so both paths do the same engine work; the difference is the endpoint's overhead. Sequential calls give the
latency added per call; ``--concurrency`` calls at once give the throughput ratio. Rounds alternate the two
paths. Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

from agentrl.bench.engine import add_engine_args

TOKEN = "bench-policy-token-0123456789"


class _Instant:
    """An engine that answers every call at once with the same ids: what is left is the endpoint's own work
    (HTTP, checks, rendering, parsing, recording)."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    async def generate(self, prompt_ids: list[int], **kw: Any) -> Any:
        from agentrl.inference.wire import Generation

        return Generation(list(self.ids), [-0.1] * len(self.ids), "stop", None, None, "instant")


class _Forced:
    """The run's client with fixed-length generations (``ignore_eos``), for equal work on both paths."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def generate(self, prompt_ids: list[int], **kw: Any) -> Any:
        return await self.inner.generate(prompt_ids, **{**kw, "ignore_eos": True})


async def _measure(args: argparse.Namespace) -> dict[str, Any]:
    import httpx
    import openai

    from agentrl.bench.engine import bench_model, engine_url
    from agentrl.config.policy import PolicyConfig
    from agentrl.envs.calc import CalcEnv
    from agentrl.inference import InferenceClient
    from agentrl.launch.stack import load_chat_format
    from agentrl.policy.run import serving
    from agentrl.policy.service import PolicyService

    model = await bench_model(args.model)
    async with engine_url(args.endpoint, model=model, dtype="float32", max_model_len=1024) as engine:
        chat = await asyncio.to_thread(load_chat_format, model)
        tools = CalcEnv.tool_schemas()
        convs = [[{"role": "system", "content": CalcEnv.system_prompt}, {"role": "user", "content": t["question"]}]
                 for t in CalcEnv.tasks("test")[: args.calls]]
        async with InferenceClient([engine], timeout_s=600) as client:
            service = PolicyService(PolicyConfig(port=0, token=TOKEN, max_context_tokens=1024), _Forced(client), chat)
            async with serving(service, TOKEN) as url, httpx.AsyncClient(timeout=30) as h:
                async def direct(messages: list[dict[str, Any]]) -> None:
                    gen = await client.generate(chat.prompt_ids(messages, tools), max_tokens=args.tokens,
                                                temperature=0.0, stop_token_ids=list(chat.stop_token_ids),
                                                ignore_eos=True)
                    assert len(gen.token_ids) == args.tokens

                async def endpoint(messages: list[dict[str, Any]]) -> None:
                    ep = (await h.post(f"{url}/v1/episodes", headers={"Authorization": f"Bearer {TOKEN}"})).json()
                    async with openai.AsyncOpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0,
                                                  timeout=600) as sdk:
                        r = await sdk.chat.completions.create(model="policy", messages=messages, tools=tools,
                                                              temperature=0.0, max_tokens=args.tokens)
                    assert r.usage.completion_tokens == args.tokens

                async def sequential(fn: Any) -> float:
                    t = time.perf_counter()
                    for m in convs:
                        await fn(m)
                    return (time.perf_counter() - t) / len(convs)

                async def concurrent(fn: Any) -> float:
                    sem = asyncio.Semaphore(args.concurrency)

                    async def one(m: list[dict[str, Any]]) -> None:
                        async with sem:
                            await fn(m)

                    t = time.perf_counter()
                    await asyncio.gather(*(one(m) for m in convs))
                    return len(convs) / (time.perf_counter() - t)

                await sequential(direct)  # warm-up of both paths (engine kernels, connections)
                await sequential(endpoint)
                lat: dict[str, list[float]] = {"direct": [], "endpoint": []}
                thr: dict[str, list[float]] = {"direct": [], "endpoint": []}
                for _ in range(args.rounds):
                    for name, fn in (("direct", direct), ("endpoint", endpoint)):
                        lat[name].append(await sequential(fn))
                        thr[name].append(await concurrent(fn))
        own = await _endpoint_only(chat, convs, tools, args)
    d_lat, e_lat = statistics.median(lat["direct"]), statistics.median(lat["endpoint"])
    d_thr, e_thr = statistics.median(thr["direct"]), statistics.median(thr["endpoint"])
    return {"bench": "policy", "calls": len(convs), "tokens_per_call": args.tokens, "rounds": args.rounds,
            "concurrency": args.concurrency, "direct_latency_ms": d_lat * 1e3, "endpoint_latency_ms": e_lat * 1e3,
            "overhead_ms_per_call": (e_lat - d_lat) * 1e3, "latency_ratio": e_lat / d_lat,
            "direct_calls_per_s": d_thr, "endpoint_calls_per_s": e_thr, "throughput_ratio": e_thr / d_thr, **own}


async def _endpoint_only(chat: Any, convs: list[Any], tools: Any, args: argparse.Namespace) -> dict[str, float]:
    """The endpoint's own cost per recorded call (raw HTTP, no SDK) with an engine that answers at once."""
    import httpx

    from agentrl.config.policy import PolicyConfig
    from agentrl.policy.run import serving
    from agentrl.policy.service import PolicyService

    answer = chat.encode('<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 + 3"}}\n</tool_call>')
    service = PolicyService(PolicyConfig(port=0, token=TOKEN), _Instant([*answer, chat.eos_token_id]), chat)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with serving(service, TOKEN) as url, httpx.AsyncClient(timeout=60) as h:
        async def call(messages: list[dict[str, Any]]) -> None:
            ep = (await h.post(f"{url}/v1/episodes", headers=auth)).json()
            r = await h.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {ep['api_key']}"},
                             json={"model": "policy", "messages": messages, "tools": tools})
            assert r.json()["choices"][0]["finish_reason"] == "tool_calls", r.text

        async def health(_: Any) -> None:
            await h.get(f"{url}/health")

        out: dict[str, float] = {}
        for name, fn in (("health", health), ("endpoint_only", call)):
            for m in convs[:4]:
                await fn(m)
            lat, thr = [], []
            for _ in range(args.rounds):
                t = time.perf_counter()
                for m in convs:
                    await fn(m)
                lat.append((time.perf_counter() - t) / len(convs))
                t = time.perf_counter()
                await asyncio.gather(*(fn(m) for m in convs))
                thr.append(len(convs) / (time.perf_counter() - t))
            out[f"{name}_ms"] = statistics.median(lat) * 1e3
            out[f"{name}_per_s"] = statistics.median(thr)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentrl bench policy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=32, help="calls per round and path")
    parser.add_argument("--tokens", type=int, default=16, help="tokens each call generates")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (medians are reported)")
    parser.add_argument("--concurrency", type=int, default=16, help="calls at once in the throughput pass")
    add_engine_args(parser)
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    if min(args.calls, args.tokens, args.rounds, args.concurrency) < 1:
        parser.error("--calls, --tokens, --rounds and --concurrency must be >= 1")
    res = asyncio.run(_measure(args))
    if not args.json:
        print(f"sequential: {res['direct_latency_ms']:.1f} ms direct, {res['endpoint_latency_ms']:.1f} ms through the "
              f"endpoint (+{res['overhead_ms_per_call']:.1f} ms, x{res['latency_ratio']:.2f}); concurrent: "
              f"{res['direct_calls_per_s']:.1f} vs {res['endpoint_calls_per_s']:.1f} calls/s "
              f"(x{res['throughput_ratio']:.2f}); the endpoint alone (an engine that answers at once): "
              f"{res['endpoint_only_ms']:.1f} ms per episode + call, {res['endpoint_only_per_s']:.0f}/s at once "
              f"(GET /health: {res['health_ms']:.1f} ms)")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
