"""Reading the session vLLM server's Prometheus counters (to act while a generation is provably running)."""

from __future__ import annotations

import re

import httpx


async def generated_tokens(url: str) -> float:
    """The engine's running total of generated tokens (``vllm:generation_tokens_total``, summed over
    its label sets: the series are split by served model name)."""
    async with httpx.AsyncClient(timeout=10) as h:
        text = (await h.get(f"{url}/metrics")).text
    values = re.findall(r"^vllm:generation_tokens_total(?:\{[^}]*\})? ([0-9.e+]+)$", text, re.M)
    assert values, "vllm:generation_tokens_total missing from /metrics"
    return sum(float(v) for v in values)
