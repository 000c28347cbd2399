"""The workload of ``agentrl bench tinker`` on agentrl's own calls, without the API: the baseline that says
what the Tinker API (the SDK, HTTP, protobuf, futures, ordering, checkpoint files) adds.

N clients run as N asyncio tasks in this process, on the same two parts ``serve-tinker`` uses: one
:class:`~agentrl.tinker.trainer.LoraTrainer` whose calls run on one worker thread (as the service runs
them) and one :class:`~agentrl.tinker.sampler.SlotSampler` engine. Each client step is the same work as an
SDK client's step: ``forward_backward`` (``importance_sampling``) and ``optim_step`` on its adapter, its
tensors copied in place into its engine slot (agentrl's own publish: no checkpoint file), and one
``sample``."""

from __future__ import annotations

import asyncio
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any


def wire_batch(data: list[Any]) -> list[Any]:
    """The SDK datums of the API phases as the trainer's own input (what the server parses them into)."""
    import numpy as np

    from agentrl.tinker.wire import WireDatum

    return [WireDatum(np.asarray(d.model_input.to_ints(), dtype=np.int64),
                      {k: np.asarray(v.to_numpy() if hasattr(v, "to_numpy") else v) for k, v in d.loss_fn_inputs.items()})
            for d in data]


class _Direct:
    def __init__(self, trainer: Any, engine: Any, work: Path, args: Any, data: list[Any]) -> None:
        self.trainer, self.engine, self.work, self.args, self.data = trainer, engine, work, args, data
        self.prompt = [int(t) for t in data[0].tokens[:8]]
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-trainer")
        self.clients = 0
        self.engine_ms: list[float] = []

    async def run(self, fn: Any, *a: Any, **kw: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, partial(fn, *a, **kw))

    async def client(self, steps: int) -> int:
        """One client's ``steps`` steps on a new adapter; returns the tokens it sampled."""
        from agentrl.tinker.trainer import LORA_ALPHA, LoraSpec

        self.clients += 1
        name = f"c{self.clients}"
        spec = LoraSpec(rank=self.args.rank, seed=self.args.seed)
        await self.run(self.trainer.add, name, spec)
        first = self.work / name
        await self.run(self.trainer.save, name, first, optimizer=False)
        await self.engine.publish(name, first)  # a slot's first load reads files (so does the API's)
        sampled = 0
        try:
            for _ in range(steps):
                await self.run(self.trainer.forward_backward, name, self.data, "importance_sampling", {}, False)
                await self.run(self.trainer.optim_step, name, {"learning_rate": 1e-4})
                tensors = await self.run(self.trainer.tensors, name)
                out = await self.engine.publish_live(name, tensors, first, scale=LORA_ALPHA / spec.rank)
                if out.get("in_place"):
                    self.engine_ms.append(float(out.get("engine_ms", float("nan"))))
                res = await self.engine.sample(name, self.prompt, num_samples=self.args.samples,
                                               max_tokens=self.args.max_tokens, temperature=1.0, stop=[])
                sampled += sum(len(s.tokens) for s in res.sequences)
        finally:
            await self.run(self.trainer.remove, name)
        return sampled


async def measure_direct(args: Any, model: str, work: Path, data: list[Any]) -> dict[str, Any]:
    """Per client count: the same fields as the API phases, from agentrl's own trainer and engine calls."""
    from agentrl.config.tinker import TinkerConfig
    from agentrl.tinker.run import context_of
    from agentrl.tinker.sampler import SlotSampler
    from agentrl.tinker.trainer import LoraTrainer
    from agentrl.tools.bench.tinker_api import phase

    window = context_of(TinkerConfig(model=model))  # the engine serve-tinker starts: same slots, ranks, window
    trainer = await asyncio.to_thread(LoraTrainer, Path(model), max_rank=args.max_rank)
    engine = await SlotSampler.start(Path(model), state_dir=work, max_adapters=args.max_adapters,
                                     max_rank=args.max_rank, max_model_len=window, log_dir=work / "logs")
    direct = _Direct(trainer, engine, work, args, data)
    try:
        await direct.client(1)  # warm-up, as in the API phases
        direct.engine_ms.clear()
        phases: dict[str, dict[str, float]] = {}
        for n in args.clients:
            t0 = time.perf_counter()
            sampled = sum(await asyncio.gather(*(direct.client(args.steps) for _ in range(n))))
            wall = time.perf_counter() - t0
            phases[str(n)] = phase(args, n, wall, sampled)
        ms = direct.engine_ms
        return {"clients": phases, "publish_engine_ms_p50": round(statistics.median(ms), 3) if ms else None,
                "publishes": len(ms)}
    finally:
        direct.pool.shutdown(wait=True)
        await engine.close()
