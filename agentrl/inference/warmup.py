"""Engine warm-up before a run's first evaluation.

A fresh vLLM server runs its first large batch several times slower than later ones: kernels and buffers
are prepared lazily for each new batch shape (measured on the embedded CPU defaults: 128 concurrent
generations took 9.3 s cold and 2.8 s warm). Without a warm-up, that cost lands on the first evaluation's
episodes and in its timings (never in the agent's time limit, which counts only tool time). One burst of
throwaway generations at the run's concurrency, with prompt lengths and generation lengths spread out (so
decode batches shrink through every size), pays it up front.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time

from agentrl.inference.client import InferenceClient, InferenceError
from agentrl.inference.wire import InvalidArgument

log = logging.getLogger(__name__)


def warmup_requests(n: int, *, vocab_size: int, max_prompt_tokens: int, max_tokens: int,
                    seed: int = 0) -> list[tuple[list[int], int]]:
    """``n`` (prompt ids, max_tokens) pairs: prompt lengths spread over [8, max_prompt_tokens] and
    generation lengths over [1, max_tokens], from ids in [0, vocab_size)."""
    if n < 1 or vocab_size < 1 or max_prompt_tokens < 1 or max_tokens < 1:
        raise InvalidArgument("n, vocab_size, max_prompt_tokens and max_tokens must all be >= 1")
    rng = random.Random(seed)
    shortest = min(8, max_prompt_tokens)
    out = []
    for i in range(n):
        frac = i / max(n - 1, 1)
        length = round(shortest + (max_prompt_tokens - shortest) * frac)
        out.append(([rng.randrange(vocab_size) for _ in range(length)], 1 + round((max_tokens - 1) * frac)))
    rng.shuffle(out)
    return out


async def warm_up(client: InferenceClient, *, model: str, concurrency: int, vocab_size: int,
                  max_prompt_tokens: int = 256, max_tokens: int = 32, seed: int = 0) -> dict[str, float]:
    """Send one burst of ``concurrency`` throwaway generations on ``model`` (the run's adapter, so the
    LoRA kernels warm up too); returns ``{"warmup_s": ..., "warmup_failed": ...}``.

    Failures are logged and counted, never raised: a warm-up must not stop a run (a broken engine shows up
    in the first evaluation's recorded errors).
    """
    reqs = warmup_requests(concurrency, vocab_size=vocab_size, max_prompt_tokens=max_prompt_tokens,
                           max_tokens=max_tokens, seed=seed)
    t0 = time.perf_counter()
    results = await asyncio.gather(
        *(client.generate(ids, max_tokens=m, temperature=1.0, model=model, ignore_eos=True) for ids, m in reqs),
        return_exceptions=True,
    )
    failed = [r for r in results if isinstance(r, BaseException)]
    unexpected = [r for r in failed if not isinstance(r, InferenceError | OSError | asyncio.TimeoutError)]
    if unexpected:
        raise unexpected[0]
    if failed:
        log.warning("engine warm-up: %d of %d requests failed; first error: %s", len(failed), len(reqs), failed[0])
    return {"warmup_s": time.perf_counter() - t0, "warmup_failed": float(len(failed))}
