"""The policy endpoint's cost: the same calls sent straight to the engine (token ids in, ids out) and through
the endpoint with the ``openai`` SDK (render, HTTP, parse, record), side by side in one run.

Every call generates exactly ``--tokens`` tokens (greedy, end-of-turn ignored) from calc's opening prompts,
so both paths do the same engine work; the difference is the endpoint's overhead. Sequential calls give the
latency added per call; ``--concurrency`` calls at once (one pass per value) give the throughput ratio. Rounds
alternate the paths: each throughput pass runs right after the same pass on the other paths, and a ratio is
the median over rounds of the ratio within a round, so the engine's drifting speed on a shared machine
cancels. The endpoint is called twice over: with plain HTTP/1.1 requests carrying the JSON the
``openai`` SDK sends, from the lean load-generating client of :mod:`agentrl.tools.bench.http1` (the endpoint's own
cost), and with the ``openai`` SDK itself (``sdk_*``: the SDK's and httpx's client-side work added, which
agent programs pay in their own processes, while here it runs on the endpoint's core). Every path keeps its
connections: agentrl's inference client, one lean connection per call in flight, one SDK client whose
per-episode copies (``with_options(api_key=...)``) share its pool. On a CPU machine the engine and this process
(the endpoint and the clients) are pinned to cores of their own (``--engine-cores``, ``--endpoint-cores``), so
they do not fight for one core. Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from typing import Any

from agentrl.core.errors import AgentRLError
from agentrl.tools.bench.engine import add_engine_args

TOKEN = "bench-policy-token-0123456789"


class BenchCheckFailed(AgentRLError, AssertionError):
    """The policy endpoint answered a benchmark's request with an error status (the run measures nothing)."""

    code = "bench.check_failed"


class _Instant:
    """An engine that answers every call at once with the same ids: what is left is the endpoint's own work
    (HTTP, checks, rendering, parsing, recording)."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    async def generate(self, prompt_ids: list[int], **kw: Any) -> Any:
        from agentrl.inference.wire import Generation

        return Generation(list(self.ids), [-0.1] * len(self.ids), "stop", None, None, "instant")


class _Forced:
    """The run's client with fixed-length generations (``ignore_eos``, no stop tokens: not even the end of a
    turn ends one), for equal work on both paths."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def generate(self, prompt_ids: list[int], **kw: Any) -> Any:
        return await self.inner.generate(prompt_ids, **{**kw, "ignore_eos": True, "stop_token_ids": []})


async def _measure(args: argparse.Namespace) -> dict[str, Any]:
    import openai

    from agentrl.config.policy import PolicyConfig
    from agentrl.envs.calc import CalcEnv
    from agentrl.http.policy.run import serving
    from agentrl.http.policy.service import PolicyService
    from agentrl.http.policy.thread import EndpointThread, LoopGenerator
    from agentrl.inference import InferenceClient
    from agentrl.launch.stack import load_chat_format
    from agentrl.tools.bench.engine import bench_model, engine_url

    model = await bench_model(args.model)
    async with engine_url(args.endpoint, model=model, dtype="float32", max_model_len=1024,
                          cpu_cores=args.engine_cores) as engine:
        chat = await asyncio.to_thread(load_chat_format, model, "hermes", args.chat_template)
        tools = CalcEnv.tool_schemas()
        convs = [[{"role": "system", "content": CalcEnv.system_prompt}, {"role": "user", "content": t["question"]}]
                 for t in CalcEnv.tasks("test")[: args.calls]]
        async with InferenceClient([engine], timeout_s=600) as client:
            engine_side: Any = _Forced(client)
            if args.serve_in == "thread":  # as a training run serves it: its own loop, the client on this one
                engine_side = LoopGenerator(engine_side, asyncio.get_running_loop())
            service = PolicyService(PolicyConfig(port=0, token=TOKEN, max_context_tokens=1024), engine_side, chat)
            host = EndpointThread(service).serving(TOKEN) if args.serve_in == "thread" else serving(service, TOKEN)
            async with host as url, \
                    openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=TOKEN, max_retries=0, timeout=600) as base:
                async def direct(messages: list[dict[str, Any]]) -> None:
                    gen = await client.generate(chat.prompt_ids(messages, tools), max_tokens=args.tokens,
                                                temperature=0.0, ignore_eos=True)
                    assert len(gen.token_ids) == args.tokens

                lean = _Lean(url, max(args.concurrency))

                async def endpoint(messages: list[dict[str, Any]]) -> None:
                    r = await lean.episode_call({"model": "policy", "messages": messages, "tools": tools,
                                                 "temperature": 0.0, "max_tokens": args.tokens})
                    assert r["usage"]["completion_tokens"] == args.tokens, r

                async def through_sdk(messages: list[dict[str, Any]]) -> None:
                    ep = await lean.request("POST", "/v1/episodes")
                    sdk = base.with_options(api_key=ep["api_key"])
                    r = await sdk.chat.completions.create(model="policy", messages=messages, tools=tools,
                                                          temperature=0.0, max_tokens=args.tokens)
                    assert r.usage.completion_tokens == args.tokens

                async def sequential(fn: Any) -> float:
                    t = time.perf_counter()
                    for m in convs:
                        await fn(m)
                    return (time.perf_counter() - t) / len(convs)

                async def concurrent(fn: Any, n: int) -> float:
                    sem = asyncio.Semaphore(n)

                    async def one(m: list[dict[str, Any]]) -> None:
                        async with sem:
                            await fn(m)

                    t = time.perf_counter()
                    await asyncio.gather(*(one(m) for m in convs))
                    return len(convs) / (time.perf_counter() - t)

                paths = (("direct", direct), ("endpoint", endpoint), ("sdk", through_sdk))
                for _, fn in paths:  # warm-up of every path (engine kernels, connections)
                    await sequential(fn)
                lat: dict[str, list[float]] = {name: [] for name, _ in paths}
                thr: dict[tuple[str, int], list[float]] = {}
                for _ in range(args.rounds):  # each pass right after the same pass on the other paths
                    for name, fn in paths:
                        lat[name].append(await sequential(fn))
                    for n in args.concurrency:
                        for name, fn in paths:
                            thr.setdefault((name, n), []).append(await concurrent(fn, n))
                streamed = await _stream_times(url, lean, convs, args.tokens)
                await lean.close()
        own = await _endpoint_only(chat, convs, tools, args)
    d_lat, e_lat, s_lat = (statistics.median(lat[k]) for k in ("direct", "endpoint", "sdk"))
    out: dict[str, Any] = {
        "bench": "policy", "calls": len(convs), "tokens_per_call": args.tokens, "rounds": args.rounds,
        "concurrency": args.concurrency, "serve_in": args.serve_in, "engine_cores": args.engine_cores,
        "endpoint_cores": args.endpoint_cores,
        "direct_latency_ms": d_lat * 1e3, "endpoint_latency_ms": e_lat * 1e3,
        "overhead_ms_per_call": (e_lat - d_lat) * 1e3, "latency_ratio": e_lat / d_lat,
        "sdk_latency_ms": s_lat * 1e3, "sdk_overhead_ms_per_call": (s_lat - d_lat) * 1e3}
    for n in args.concurrency:
        d_thr, e_thr, s_thr = (statistics.median(thr[(k, n)]) for k in ("direct", "endpoint", "sdk"))
        out.update({f"direct_calls_per_s_{n}": d_thr, f"endpoint_calls_per_s_{n}": e_thr,
                    f"throughput_ratio_{n}": _paired(thr[("endpoint", n)], thr[("direct", n)]),
                    f"sdk_calls_per_s_{n}": s_thr, f"sdk_throughput_ratio_{n}": _paired(thr[("sdk", n)], thr[("direct", n)]),
                    f"throughput_ratio_rounds_{n}": [round(e / d, 3) for e, d in zip(thr[("endpoint", n)],
                                                                                     thr[("direct", n)], strict=True)]})
    out["throughput_ratio"] = min(out[f"throughput_ratio_{n}"] for n in args.concurrency)
    return {**out, **streamed, **own, "sdk_client_ms": _client_cost_ms()}


async def _stream_times(url: str, lean: _Lean, convs: list[Any], tokens: int) -> dict[str, float]:
    """Sequential streamed calls, one per new episode, without tools (so their text streams as it is sampled):
    the median time to the first chunk with content and to the end of the stream."""
    import httpx

    from agentrl.inference.stream import sse_data

    first, total = [], []
    async with httpx.AsyncClient(timeout=600) as http:
        for messages in convs:
            ep = await lean.request("POST", "/v1/episodes")
            body = {"model": "policy", "messages": messages, "temperature": 0.0, "max_tokens": tokens, "stream": True}
            t0, t1 = time.perf_counter(), None
            async with http.stream("POST", f"{url}/v1/chat/completions", json=body,
                                   headers={"Authorization": f"Bearer {ep['api_key']}"}) as r:
                if r.status_code != 200:
                    raise BenchCheckFailed(f"streamed call: HTTP {r.status_code}: {(await r.aread())[:300]!r}")
                async for data in sse_data(r):
                    if t1 is None and any(c.get("delta", {}).get("content") for c in json.loads(data).get("choices", [])):
                        t1 = time.perf_counter()
            t = time.perf_counter()
            first.append((t1 or t) - t0)
            total.append(t - t0)
    return {"stream_first_content_ms": statistics.median(first) * 1e3, "stream_total_ms": statistics.median(total) * 1e3}


class _Lean:
    """Lean keep-alive connections to the endpoint (:mod:`agentrl.tools.bench.http1`), one per call in flight."""

    def __init__(self, url: str, n: int) -> None:
        from agentrl.tools.bench.http1 import Connection

        self._free: asyncio.Queue[Any] = asyncio.Queue()
        for _ in range(n):
            self._free.put_nowait(Connection(url, timeout_s=600))

    async def request(self, method: str, path: str, body: Any = None, key: str = TOKEN) -> Any:
        conn = await self._free.get()
        try:
            status, out = await conn.request(method, path, body, headers={"Authorization": f"Bearer {key}"})
        finally:
            self._free.put_nowait(conn)
        if status not in (200, 201):
            raise BenchCheckFailed(f"{method} {path}: HTTP {status}: {out}")
        return out

    async def episode_call(self, body: dict[str, Any]) -> Any:
        """A new episode and one chat completion in it (what one agent program's first call costs)."""
        ep = await self.request("POST", "/v1/episodes")
        return await self.request("POST", "/v1/chat/completions", body, key=ep["api_key"])

    async def close(self) -> None:
        while not self._free.empty():
            await self._free.get_nowait().close()


def _client_cost_ms() -> float:
    """What constructing one fresh ``openai`` client costs (an agent program pays it once, in its own process;
    the benchmark reuses one, so this is not in the figures above)."""
    import openai

    t = time.perf_counter()
    for _ in range(5):
        openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="x", max_retries=0)
    return (time.perf_counter() - t) / 5 * 1e3


async def _endpoint_only(chat: Any, convs: list[Any], tools: Any, args: argparse.Namespace) -> dict[str, float]:
    """The endpoint's own cost per recorded call (lean HTTP, no SDK) with an engine that answers at once."""
    from agentrl.config.policy import PolicyConfig
    from agentrl.http.policy.run import serving
    from agentrl.http.policy.service import PolicyService

    answer = chat.encode('<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 + 3"}}\n</tool_call>')
    service = PolicyService(PolicyConfig(port=0, token=TOKEN), _Instant([*answer, chat.eos_token_id]), chat)
    async with serving(service, TOKEN) as url:
        lean = _Lean(url, len(convs))

        async def call(messages: list[dict[str, Any]]) -> None:
            r = await lean.episode_call({"model": "policy", "messages": messages, "tools": tools})
            assert r["choices"][0]["finish_reason"] == "tool_calls", r

        async def health(_: Any) -> None:
            await lean.request("GET", "/health")

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
        await lean.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentrl bench policy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=32, help="calls per round and path")
    parser.add_argument("--tokens", type=int, default=16, help="tokens each call generates")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (medians are reported)")
    parser.add_argument("--concurrency", default="16,64",
                        help="calls at once in the throughput passes, comma-separated (one pass per value)")
    parser.add_argument("--engine-cores", default="auto", help="CPU: pin the vLLM server to these cores (auto: "
                        "core 0 on a machine without a GPU and with 2 or more cores; none: no pinning)")
    parser.add_argument("--endpoint-cores", default="auto", help="CPU: pin this process (the endpoint and its "
                        "clients) to these cores (auto: the cores the engine does not have)")
    parser.add_argument("--serve-in", choices=("thread", "loop"), default="thread",
                        help="thread: the endpoint on an event loop of its own, its generations on the engine "
                        "client's loop (as a training run serves it); loop: all on one loop (as serve-policy does)")
    add_engine_args(parser)
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    try:
        args.concurrency = [int(n) for n in str(args.concurrency).split(",")]
    except ValueError:
        parser.error(f"--concurrency takes comma-separated integers, not {args.concurrency!r}")
    if min(args.calls, args.tokens, args.rounds, *args.concurrency) < 1:
        parser.error("--calls, --tokens, --rounds and --concurrency must be >= 1")
    args.engine_cores, args.endpoint_cores = _cores(args.engine_cores, args.endpoint_cores, args.endpoint)
    if args.endpoint_cores:
        from agentrl.launch.placement import parse_devices

        os.sched_setaffinity(0, parse_devices(args.endpoint_cores))
    res = asyncio.run(_measure(args))
    if not args.json:
        passes = ", ".join(f"{n} at once: {res[f'direct_calls_per_s_{n}']:.1f} vs {res[f'endpoint_calls_per_s_{n}']:.1f} "
                           f"calls/s (x{res[f'throughput_ratio_{n}']:.2f}; with the SDK x{res[f'sdk_throughput_ratio_{n}']:.2f})"
                           for n in args.concurrency)
        print(f"sequential: {res['direct_latency_ms']:.1f} ms direct, {res['endpoint_latency_ms']:.1f} ms through the "
              f"endpoint (+{res['overhead_ms_per_call']:.1f} ms, x{res['latency_ratio']:.2f}); {passes}; "
              "the endpoint alone (an engine that answers at once): "
              f"{res['endpoint_only_ms']:.1f} ms per episode + call, {res['endpoint_only_per_s']:.0f}/s at once "
              f"(GET /health: {res['health_ms']:.1f} ms); streamed: first text after {res['stream_first_content_ms']:.1f} ms "
              f"of {res['stream_total_ms']:.1f} ms")
    print(json.dumps(res))
    return 0


def _paired(path: list[float], direct: list[float]) -> float:
    """The median over rounds of a path's rate over the direct rate of the same round (the engine's own speed
    drifts on a shared machine; a round's passes run one right after the other)."""
    return statistics.median(p / d for p, d in zip(path, direct, strict=True))


def _cores(engine: str, endpoint: str, running: str | None) -> tuple[str | None, str | None]:
    """The engine's and this process's cores (None: not pinned). ``auto`` splits a CPU machine's cores: the
    engine gets core 0 (a server it starts; a running one is left as it is), this process the others."""
    import torch

    from agentrl.launch.placement import format_devices, parse_devices

    mine = sorted(os.sched_getaffinity(0))
    auto = len(mine) >= 2 and not torch.cuda.is_available()
    engine_cores = (str(mine[0]) if auto and not running else None) if engine == "auto" else engine
    if engine_cores == "none":
        engine_cores = None
    if endpoint == "auto":
        rest = [c for c in mine if engine_cores is None or c not in parse_devices(engine_cores)]
        endpoint = format_devices(rest) if auto and engine_cores and rest else "none"
    return engine_cores, None if endpoint == "none" else endpoint


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
