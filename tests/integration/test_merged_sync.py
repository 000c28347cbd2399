"""Merged LoRA sync on the real engine: only the adapter crosses (shared memory, or the call body for another
host), the engine merges ``W0 + scaling * B @ A`` into its base weights, and its base model then serves what
vLLM's own LoRA serving of the same adapter file served on the base weights, version after version: every
module kind (packed q/k/v and gate/up, down_proj), modules scaled differently. A generation that spans a
merge keeps its prefix and continues on the new weights, each token tagged with its version; a bad adapter
is refused before any weight changes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentrl.config.trainer import ALL_LINEAR
from agentrl.core.versions import token_versions
from agentrl.inference import InferenceClient
from agentrl.tools.bench.models import ATTENTION, lora_shapes, random_lora, save_lora
from agentrl.weight_sync.control import controlled
from agentrl.weight_sync.inplace import SyncError
from agentrl.weight_sync.merged import MergedAdapterSync
from tests.integration.conftest import tiny_model_config
from tests.integration.vllm_metrics import slowed_engine, start_paused_mid_generation, streaming_past

pytestmark = [pytest.mark.integration]

LONG_PROMPT = [(i * 7) % 390 + 5 for i in range(300)]  # several KV blocks: a stale prefix cache would show
PROMPT = [(i * 13) % 390 + 5 for i in range(32)]
N_TOKENS = 300  # at least 6 s on the slowed engine: far longer than a pause round trip



class _Trainer:
    """The adapter's tensors and its files, as the trainer hands them out."""

    def __init__(self, tensors: dict, alphas: dict[str, float] | None = None) -> None:
        self.tensors, self.alphas = tensors, alphas

    async def get_adapter_tensors(self) -> dict:
        return self.tensors

    async def save_adapter(self, path: Path) -> dict:
        save_lora(path, self.tensors, alpha_pattern=self.alphas)
        return {"path": str(path)}


@pytest.fixture(scope="module")
def engine(weights_engine: Any) -> Any:
    """The session server: merges replace its base weights (its own are loaded back after this module); its
    requests for the model ``base`` run on them, with no adapter."""
    return weights_engine


async def _greedy(client: InferenceClient, model: str | None = None, max_tokens: int = 6):
    return await client.generate(LONG_PROMPT, max_tokens=max_tokens, temperature=0.0, model=model)


def _zero() -> dict:
    """An adapter of zeros on every linear layer: merged, it gives the base weights back."""
    return {n: t * 0 for n, t in random_lora(lora_shapes(tiny_model_config(), 16, tuple(ALL_LINEAR)), 0).items()}


def _close(x: Any, y: Any, tol: float = 1e-3) -> bool:
    return x.token_ids == y.token_ids and max(abs(a - b) for a, b in zip(x.logprobs, y.logprobs, strict=True)) <= tol


async def _lora_reference(client: InferenceClient, trainer: _Trainer, path: Path) -> Any:
    """What vLLM's LoRA serving of ``trainer``'s adapter (loaded from files) gives on the base weights now."""
    await trainer.save_adapter(path)
    await client.load_lora_adapter(path.name, str(path))
    try:
        return await _greedy(client, path.name)
    finally:
        await client.unload_lora_adapter(path.name)


@pytest.mark.parametrize(("targets", "alphas", "network"),
                         [(ATTENTION, None, False), (tuple(ALL_LINEAR), {"down_proj": 8, "q_proj": 64}, False),
                          (tuple(ALL_LINEAR), None, True)],
                         ids=["attention", "every-linear-per-module-alpha", "network"])
async def test_a_merged_adapter_serves_what_vllms_lora_serves(engine, tmp_path: Path, targets: tuple[str, ...],
                                                              alphas: dict | None, network: bool) -> None:
    shapes = lora_shapes(tiny_model_config(), 16, targets)
    trainer = _Trainer(random_lora(shapes, seed=0), alphas)
    async with InferenceClient([engine.url], timeout_s=120) as client:
        base = await _greedy(client)
        with MergedAdapterSync(trainer, client, remote=[engine.url] if network else []) as sync:
            for version, seed in ((1, 1), (2, 2)):
                trainer.tensors = random_lora(shapes, seed=seed)
                ref = await _lora_reference(client, trainer, tmp_path / f"merged-ref-{version}")
                m = await sync.publish(version)
                assert m["engine_ms"] > 0 and m["engines_failed"] == 0 and m["adapter_bytes"] > 0, m
                got = await _greedy(client)
                assert got.weight_versions and got.weight_versions[-1][0] == str(version)
                assert _close(got, ref), (got, ref)
                assert not _close(got, base, tol=1e-2)
                trainer.tensors = {n: t * 0 for n, t in trainer.tensors.items()}
                await sync.publish(version)  # each merge starts from the kept W0: a zero adapter gives it back
                assert _close(await _greedy(client), base, tol=1e-5)


async def test_a_generation_spanning_a_merge_continues_on_the_new_weights(engine) -> None:
    shapes = lora_shapes(tiny_model_config(), 16, tuple(ALL_LINEAR))
    trainer = _Trainer(random_lora(shapes, seed=20))
    async with InferenceClient([engine.url], timeout_s=300) as client:
        with MergedAdapterSync(trainer, client) as sync:
            await sync.publish(1)

            async def greedy() -> Any:
                return await client.generate(PROMPT, max_tokens=N_TOKENS, temperature=0.0, ignore_eos=True,
                                             stop_token_ids=[])

            ref = await greedy()
            trainer.tensors = random_lora(shapes, seed=21)
            try:
                running = await start_paused_mid_generation(client, engine.url, greedy, first=8, total=N_TOKENS)
                await sync.publish(2)  # pauses (keep: already), merges, relabels, resets the cache, resumes
            finally:
                await client.resume()
            gen = await running
            after = await greedy()
    versions = token_versions(gen, -1)
    assert 2 in versions, f"no token tagged v2: spans {gen.weight_versions}"
    k = versions.index(2)
    assert 0 < k < N_TOKENS and versions == [1] * k + [2] * (N_TOKENS - k), gen.weight_versions
    assert gen.token_ids[:k] == ref.token_ids[:k], "the prefix generated before the merge must be kept"
    assert gen.token_ids != ref.token_ids and after.token_ids != ref.token_ids  # the new weights took over


async def test_a_bad_adapter_is_refused_and_the_engine_keeps_serving(engine) -> None:
    shapes = lora_shapes(tiny_model_config(), 16, ATTENTION)
    tensors = random_lora(shapes, seed=30)
    bad = {n: (t[:, :-1].contiguous() if ".lora_A." in n else t) for n, t in tensors.items()}  # A a column short
    async with InferenceClient([engine.url], timeout_s=120) as client:
        before = await _greedy(client)
        with MergedAdapterSync(_Trainer(bad), client) as sync:
            with pytest.raises(SyncError, match="does not fit the base weight"):
                await sync.publish(7)
        assert client.pool.endpoints[0].down  # out of rotation until a complete load
    async with InferenceClient([engine.url], timeout_s=120) as again:  # its weights were never touched
        await again.resume()
        assert _close(await _greedy(again), before, tol=1e-6)


@pytest.mark.parametrize("mode", ["merged", "lora"])
def test_bench_loop_adapter_reports_adapter_over_base(engine, tiny_model_dir: Path, mode: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``agentrl bench loop --adapter``: the same requests on the base model and with an adapter, alternating;
    the report is consistent (no timing is asserted) and the engine is left with its base weights."""
    import asyncio

    from agentrl.tools.bench.loop import main

    async def greedy(restore: bool = False) -> Any:
        async with InferenceClient([engine.url], timeout_s=120) as client:
            if restore:  # earlier tests left an adapter merged: the base weights first
                with MergedAdapterSync(_Trainer(_zero()), client) as sync:
                    await sync.publish(0)
            return await _greedy(client)

    before = asyncio.run(greedy(restore=True))
    assert main(["--adapter", mode, "--tasks", "2", "--group-size", "2", "--concurrency", "4", "--repeats", "2",
                 "--json", "--model", str(tiny_model_dir), "--endpoint", engine.url]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["adapter"] == mode and r["adapter_rank"] == 16 and len(r["adapter_over_base_pairs"]) == 2
    assert r["base_tokens_per_s"] > 0 and r["adapter_tokens_per_s"] > 0 and r["tokens_per_phase"] > 0
    assert r["target_met"] == (r["adapter_over_base"] >= 0.9)
    assert ("merge_engine_ms_p50" in r) == (mode == "merged")
    assert _close(asyncio.run(greedy()), before, tol=1e-5)


async def test_an_adapter_with_its_norms_and_embedding_trains_through_the_merge(engine, tiny_model_dir: Path,
                                                                                tmp_path: Path) -> None:
    """``trainer.lora_train_norms`` and ``trainer.lora_train_embedding``: a LoRA run that also trains every norm
    and the (tied) embedding publishes all of them, merged by the engine. After each sync the engine scores
    what the trainer scores, and at the end the engine serves what peft's own merge of the final adapter
    gives, norms and embedding included: the same adapter without its norms, or without its embedding, would
    score measurably differently. Last in the module: it leaves trained norms and embedding in the engine,
    which the module's fixture restores. The evaluation of the saved adapter serves the same."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from agentrl.config.run import load_config
    from agentrl.orchestrator.metrics import read_jsonl
    from agentrl.orchestrator.run import TrainingRun

    cfg = load_config(None, {
        "env": "calc", "output_dir": str(tmp_path), "model": str(tiny_model_dir), "endpoints": [engine.url],
        "name": "lora-whole", "steps": 2, "tasks_per_step": 4, "group_size": 4, "eval_size": 2, "eval_every": 0,
        "time_limit_min": None, "engine_warmup": False,
        "trainer": {"lora_train_norms": True, "lora_train_embedding": True, "lr": 5e-2, "lr_schedule": "constant"}})
    assert cfg.trainer.lora_trains_whole and cfg.transport.transport == "auto"  # settled when the run resolves it
    await TrainingRun(cfg, progress=False).run()
    run_dir = tmp_path / "lora-whole"
    train = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["version"] for r in train] == [1, 2]
    for r in train:
        assert r["num_failed"] == 0 and r["engines_failed"] == 0
        if r["num_trained"]:
            assert r["train_is_weight_mean"] == pytest.approx(1.0, abs=0.02)
            assert abs(r["train_behav_logp_diff"]) < 0.02

    def scored(model: Any, ids: list[int], n: int) -> list[float]:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -n - 1:-1].float()
        return logits.log_softmax(-1).gather(-1, torch.tensor(ids[-n:])[:, None])[:, 0].tolist()

    def load(base_for: str | None = None) -> Any:
        """peft's merge of the final adapter; with ``base_for``, the tensors whose names end so left at the
        base model's."""
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        merged = PeftModel.from_pretrained(base, run_dir / "final_adapter").merge_and_unload()
        if base_for:
            fresh = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).named_parameters())
            with torch.no_grad():
                for name, p in merged.named_parameters():
                    if name.endswith(base_for):
                        p.copy_(fresh[name])
        return merged.eval()

    # ``agentrl eval --adapter``: the saved adapter carries its norms and embedding, so the evaluation serves it
    # merged (the transport a run that trained it settles on); the linear layers are set back to the base's
    # first, so what the engine serves below is the evaluation's merge
    from agentrl.orchestrator.evaluate import run_eval

    async with InferenceClient([engine.url], timeout_s=120) as client:
        with MergedAdapterSync(_Trainer(_zero()), client) as zero:
            await zero.publish(3)
    result = await run_eval(cfg.with_changes({"output_dir": str(tmp_path / "eval")}), adapter=run_dir / "final_adapter",
                            n=2)
    assert result["num_tasks"] == 2 and result.get("num_failed", 0) == 0, result
    async with InferenceClient([engine.url], timeout_s=120) as client:
        gen = await client.generate(PROMPT, max_tokens=24, temperature=0.0, model="base")
    ids = PROMPT + list(gen.token_ids)
    whole = _mae(gen.logprobs, scored(load(), ids, len(gen.token_ids)))
    no_norms = _mae(gen.logprobs, scored(load("norm.weight"), ids, len(gen.token_ids)))
    no_embedding = _mae(gen.logprobs, scored(load("embed_tokens.weight"), ids, len(gen.token_ids)))
    assert whole < 1e-3 and min(no_norms, no_embedding) > 10 * max(whole, 1e-4), (whole, no_norms, no_embedding)


def _mae(xs: list[float], ys: list[float]) -> float:
    return sum(abs(a - b) for a, b in zip(xs, ys, strict=True)) / max(len(xs), 1)


async def test_over_the_control_socket_a_merge_lands_between_two_steps_without_a_pause(engine) -> None:
    """The merge, its label and the reset as one message on the engine core's control socket, while a
    generation runs: no pause, yet its tokens split once between the versions, the prefix is kept, and what
    follows is what the new weights generate from that prefix (the request recomputed its KV under them)."""
    shapes = lora_shapes(tiny_model_config(), 16, tuple(ALL_LINEAR))
    trainer = _Trainer(random_lora(shapes, seed=40))

    async def greedy(client: InferenceClient, prompt: list[int] = PROMPT, n: int = N_TOKENS, on: Any = None) -> Any:
        return await client.generate(prompt, max_tokens=n, temperature=0.0, ignore_eos=True, stop_token_ids=[],
                                     on_tokens=on)

    async with InferenceClient([engine.url], timeout_s=300) as client, controlled(client) as fast:
        assert fast.atomic, "the session engine runs its worker in its engine core: it must open a control socket"
        with MergedAdapterSync(trainer, fast) as sync:
            assert sync.atomic
            m = await sync.publish(1)
            assert m["engines_control"] == 1 and "merge_pause_ms" not in m and m["engines_failed"] == 0, m
            ref = await greedy(client)
            trainer.tensors = random_lora(shapes, seed=41)
            with slowed_engine():
                running = await streaming_past(lambda on: greedy(client, on=on))
                m = await sync.publish(2)
            gen = await running
            assert m["engines_control"] == 1 and "merge_pause_ms" not in m, m
            versions = token_versions(gen, -1)
            assert 2 in versions, f"no token tagged v2: spans {gen.weight_versions}"
            k = versions.index(2)
            assert 8 <= k < N_TOKENS and versions == [1] * k + [2] * (N_TOKENS - k), gen.weight_versions
            assert gen.token_ids[:k] == ref.token_ids[:k], "the prefix generated before the merge must be kept"
            rest = await greedy(client, PROMPT + gen.token_ids[:k], N_TOKENS - k)
            assert rest.token_ids == gen.token_ids[k:], "after the merge, the new weights' own continuation"


async def test_over_the_control_socket_a_bad_adapter_is_refused_and_the_engine_taken_out(engine) -> None:
    shapes = lora_shapes(tiny_model_config(), 16, ATTENTION)
    tensors = random_lora(shapes, seed=31)
    bad = {n: (t[:, :-1].contiguous() if ".lora_A." in n else t) for n, t in tensors.items()}
    async with InferenceClient([engine.url], timeout_s=120) as client:
        before = await _greedy(client)
        async with controlled(client) as fast:
            with MergedAdapterSync(_Trainer(bad), fast) as sync:
                with pytest.raises(SyncError, match="does not fit the base weight"):
                    await sync.publish(7)
        assert client.pool.endpoints[0].down
    async with InferenceClient([engine.url], timeout_s=120) as again:
        await again.resume()  # the engine core froze it at the failure; the publisher then aborted its requests
        assert _close(await _greedy(again), before, tol=1e-6)
