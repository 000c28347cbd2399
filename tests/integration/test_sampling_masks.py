"""Sampling masks on the real CPU engine: for top-k, top-p and min-p, alone and combined, the kept set the
engine's capture records at every sampled position is the set its own processed distribution kept (the
engine's top-20 processed logprobs, where the set is smaller than 20: finite inside it, ``-inf`` outside), a
request recomputed after a prefix-cache hit keeps one mask per token, and the trainer's renormalised logprob of
each sampled token equals the engine's."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from agentrl.inference import InferenceClient
from agentrl.inference.wire import InferenceError

pytestmark = pytest.mark.integration

PROMPTS = [[(i * 13 + j * 31) % 900 + 5 for i in range(24 + 5 * j)] for j in range(6)]
TOP = 20
CASES = {"top_k": {"top_k": 5}, "top_p": {"top_p": 0.5}, "min_p": {"min_p": 0.2},
         "all": {"top_k": 12, "top_p": 0.7, "min_p": 0.05}}


async def _generate(client: InferenceClient, prompt: list[int], **kw: object):
    return await client.generate(prompt, max_tokens=12, temperature=kw.pop("temperature", 1.0), ignore_eos=True,
                                 sampling_mask=True, top_logprobs=TOP, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("case", list(CASES))
async def test_captured_masks_are_the_engines_kept_sets(vllm_server, case: str) -> None:
    async with InferenceClient([vllm_server.url], timeout_s=120) as client:
        rec = (await client.enable_mask_capture())[vllm_server.url]
        assert rec["ok"], rec
        checked = complete = 0
        for temperature in (1.0, 0.7):
            for prompt in PROMPTS:
                gen = await _generate(client, prompt, temperature=temperature, **CASES[case])
                mask = gen.sampling_mask
                assert mask is not None and mask.n == len(gen.token_ids) == 12
                assert gen.top_logprobs is not None
                for t, (tok, top) in enumerate(zip(gen.token_ids, gen.top_logprobs, strict=True)):
                    kept = mask.row(t)
                    assert kept[tok], "the sampled token is in its kept set"
                    # vLLM writes a logprob of -inf as -9999.0
                    finite = {i for i, lp in top.items() if math.isfinite(lp) and lp > -9999.0}
                    assert all(kept[i] for i in finite), "every token the engine kept is recorded as kept"
                    if len(finite) < len(top):  # the set ends inside the top 20: the whole set is known
                        assert set(np.flatnonzero(kept).tolist()) == finite
                        complete += 1
                    if mask.counts[t]:  # the sampled token's logprob is of the renormalised distribution
                        assert gen.logprobs[t] == pytest.approx(top[tok], abs=1e-6)
                    checked += 1
        assert complete >= checked // 2, f"only {complete} of {checked} sets were checked whole"


async def test_a_cached_prefix_and_untruncated_requests_keep_one_mask_per_token(vllm_server) -> None:
    async with InferenceClient([vllm_server.url], timeout_s=120) as client:
        assert (await client.enable_mask_capture())[vllm_server.url]["ok"]
        first = await _generate(client, PROMPTS[0], top_k=3)
        again = await _generate(client, PROMPTS[0], top_k=3)  # its prompt's blocks come from the prefix cache
        assert first.sampling_mask is not None and again.sampling_mask is not None
        assert again.sampling_mask.n == len(again.token_ids)
        assert all(c == 3 for c in again.sampling_mask.counts) or all(
            0 < c <= 3 for c in again.sampling_mask.counts)
        plain = await _generate(client, PROMPTS[1])  # nothing cut: count-0 rows, no bytes
        assert plain.sampling_mask is not None and plain.sampling_mask.counts == [0] * 12
        assert plain.sampling_mask.data == b""


async def test_the_trainer_scores_the_masked_distribution_as_the_engine(vllm_server, tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32).eval()
    async with InferenceClient([vllm_server.url], timeout_s=120) as client:
        assert (await client.enable_mask_capture())[vllm_server.url]["ok"]
        worst_masked = worst_plain = 0.0
        for prompt in PROMPTS[:4]:
            gen = await _generate(client, prompt, temperature=0.7, **CASES["all"])
            ids = torch.tensor([prompt + gen.token_ids])
            with torch.no_grad():
                logits = model(ids).logits[0, len(prompt) - 1: -1].float() / 0.7
            assert gen.sampling_mask is not None
            for t, tok in enumerate(gen.token_ids):
                kept = torch.from_numpy(gen.sampling_mask.row(t))
                masked = torch.log_softmax(logits[t].masked_fill(~kept, float("-inf")), -1)[tok]
                plain = torch.log_softmax(logits[t], -1)[tok]
                worst_masked = max(worst_masked, abs(float(masked) - gen.logprobs[t]))
                worst_plain = max(worst_plain, abs(float(plain) - gen.logprobs[t]))
        assert worst_masked < 1e-4, "renormalised over the recorded set, the trainer scores what the engine sampled"
        assert worst_plain > 1e-2, "the control: without the mask the logprobs differ"


async def test_a_mask_the_engine_does_not_hold_is_an_error(vllm_server) -> None:
    async with InferenceClient([vllm_server.url], timeout_s=120) as client:
        assert (await client.enable_mask_capture())[vllm_server.url]["ok"]
        gen = await _generate(client, PROMPTS[2], top_k=4)
        ep = client.pool.endpoints[0]
        with pytest.raises(InferenceError, match="no sampling masks"):
            await client._mask_of(ep, gen, "no-such-request")  # taken already, or never made


def test_env_server_rollouts_return_sampling_masks(vllm_server, tiny_model_dir: Path, tmp_path: Path) -> None:
    """``POST /v1/rollouts`` with truncated sampling and ``return_sampling_mask``: the trajectory carries one
    kept set per completion token (count 0 on the tool observations), the contract of agentrl's own loop; left
    out, the same rollout records none."""
    import httpx

    from agentrl.core.types import Trajectory
    from agentrl.tools.bench.env_server import ServerProcess

    with ServerProcess(["calc"], extra=["--tokenizer", str(tiny_model_dir)], log_path=tmp_path / "s.log") as server:
        headers = {"Authorization": f"Bearer {server.token}"}
        body = {"env": "calc", "task_id": "calc-test-0", "base_url": vllm_server.url, "model": "base",
                "sampling": {"temperature": 1.0, "top_k": 5, "min_p": 0.05, "max_context_tokens": 512},
                "return_sampling_mask": True}
        r = httpx.post(server.url + "/v1/rollouts", json=body, headers=headers, timeout=300)
        assert r.status_code == 200, r.text
        traj = Trajectory.model_validate(r.json()["trajectory"])
        traj.check()
        assert not traj.failed, traj.error
        mask = traj.sampling_mask
        assert mask is not None and mask.n == len(traj.completion_ids) and mask.masked > 0
        for t, (tok, m) in enumerate(zip(traj.completion_ids, traj.loss_mask, strict=True)):
            assert (0 < mask.counts[t] <= 5 and mask.row(t)[tok]) if m else mask.counts[t] == 0
        r = httpx.post(server.url + "/v1/rollouts", json={**body, "return_sampling_mask": False}, headers=headers,
                       timeout=300)
        assert r.status_code == 200 and Trajectory.model_validate(r.json()["trajectory"]).sampling_mask is None


@pytest.mark.parametrize("action", ["recompute", "abort"])
async def test_an_interrupted_generation_keeps_one_mask_per_token(vllm_server, action: str) -> None:
    """A generation frozen mid-way as a weight update freezes it: its KV dropped and recomputed under a new
    version (``reset_prefix_cache(running=True)``, then resumed), or aborted with what it had sampled. Either
    way the masks cover exactly its tokens, each sampled token inside its own kept set of five."""
    from tests.integration.vllm_metrics import start_paused_mid_generation

    n = 300
    async with InferenceClient([vllm_server.url], timeout_s=300) as client:
        assert (await client.enable_mask_capture())[vllm_server.url]["ok"]

        async def request():
            return await client.generate(PROMPTS[3], max_tokens=n, temperature=1.0, top_k=5, ignore_eos=True,
                                         sampling_mask=True)

        try:
            task = await start_paused_mid_generation(client, vllm_server.url, request, first=8, total=n)
            if action == "recompute":
                await client.reset_prefix_cache(running=True)
            else:
                await client.pause("abort")
        finally:
            await client.resume()
        gen = await task
    mask = gen.sampling_mask
    assert mask is not None and mask.n == len(gen.token_ids) == len(gen.logprobs)
    assert (gen.finish_reason, len(gen.token_ids) == n) == (("length", True) if action == "recompute" else
                                                             ("abort", False))
    assert all(c == 5 for c in mask.counts)
    assert all(mask.row(t)[tok] for t, tok in enumerate(gen.token_ids))
