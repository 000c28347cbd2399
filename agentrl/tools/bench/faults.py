"""The engine pair of the fault benchmark (``agentrl bench soak``): killing engine B, starting it again on its
port, and checking afterwards that it serves the run's policy (its version label and its weights)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any


async def kill_engine(server: Any, timeout_s: float = 30.0) -> None:
    """SIGKILL to ``server``'s process group (its engine core and workers too), as a crash would; returns once
    none of them is left (a process that is still dying may hold the port)."""
    from agentrl.core.utils.procs import process_table
    from agentrl.tools.bench.errors import BenchFailed

    os.killpg(server.pgid, signal.SIGKILL)
    await asyncio.to_thread(server.proc.wait, timeout_s)
    deadline = time.monotonic() + timeout_s
    while any(pgid == server.pgid for _, pgid, _ in process_table().values()):
        if time.monotonic() > deadline:
            raise BenchFailed(f"engine {server.url}: processes of group {server.pgid} still alive "
                              f"{timeout_s:.0f}s after SIGKILL")
        await asyncio.sleep(0.1)


def engine_again(server: Any) -> Any:
    """A new (not started) vLLM server of ``server``'s config on its port, logging beside it."""
    from agentrl.inference import VLLMServer

    return VLLMServer(server.cfg.model_copy(update={"port": server.port}), server.log_dir)


def engine_pair_config(model: str) -> Any:
    """The server config of the two engines of a fault benchmark (the embedded model, LoRA, a 1024 window)."""
    from agentrl.inference import VLLMServerConfig

    return VLLMServerConfig(model=model, dtype="float32", max_model_len=1024, max_lora_rank=16, max_loras=2,
                            startup_timeout_s=600)


async def same_policy(url_a: str, url_b: str, adapter: str) -> tuple[str | None, bool]:
    """Ask both engines for the same greedy tokens of ``adapter``: the policy version B serves, and whether B's
    tokens are A's with logprobs within 1e-4 (B holds the trained adapter itself, not only its version label)."""
    from agentrl.inference import InferenceClient

    gens = []
    for url in (url_a, url_b):
        async with InferenceClient([url], timeout_s=60) as direct:
            gens.append(await direct.generate(list(range(5, 45)), max_tokens=8, temperature=0.0, model=adapter,
                                              ignore_eos=True))
    served = gens[1].weight_versions[-1][0] if gens[1].weight_versions else None
    match = gens[0].token_ids == gens[1].token_ids and max(
        abs(x - y) for x, y in zip(gens[0].logprobs, gens[1].logprobs, strict=True)) < 1e-4
    return served, match
