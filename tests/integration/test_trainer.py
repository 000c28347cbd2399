"""The FSDP2 trainer under real torchrun on a tiny random Qwen2: 1 vs 2 ranks, learning, adapters, resume."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from agentrl.config.trainer import TrainerConfig
from agentrl.core.types import TrainSample
from agentrl.trainer.client import TrainerError, TrainerProcess
from agentrl.trainer.messages import Ping, Request
from tests.conftest import require

pytestmark = pytest.mark.integration

ENV = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer Qwen2 saved as a HF directory (plus a tokenizer file to be copied on full save)."""
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("tiny-qwen2")
    config = transformers.Qwen2Config(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, head_dim=64,
        intermediate_size=256, vocab_size=300, max_position_embeddings=256, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(123)
    transformers.Qwen2ForCausalLM(config).save_pretrained(path)
    (path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 256}))
    return path


def make_batch() -> list[TrainSample]:
    """Five off-policy samples of different lengths (unequal micro-batch counts on 2 ranks)."""
    rng = random.Random(0)
    out = []
    for i in range(5):
        n, prompt = 12 + 3 * i, 5
        mask = [0] * prompt + [1] * (n - prompt)
        out.append(
            TrainSample(
                input_ids=[rng.randrange(1, 300) for _ in range(n)],
                loss_mask=mask,
                behav_logprobs=[-5.7 + rng.uniform(-0.3, 0.3) if m else 0.0 for m in mask],
                advantage=0.5 + 0.2 * i,
                versions=[0 if m else -1 for m in mask],
            )
        )
    return out


def lora_config(model: Path) -> TrainerConfig:
    # CPU/gloo on any machine (2 ranks need 2 GPUs otherwise).
    # adam_eps 1e-4: with a tiny eps, Adam turns float-rounding noise of near-zero gradients into
    # visible differences between world sizes.
    return TrainerConfig(
        model_path=str(model), lr=1e-3, adam_eps=1e-4, micro_batch_tokens=32, num_minibatches=2,
        loss={"kl_coef": 0.05, "is_correction": "tis"}, device="cpu", heartbeat_s=0.2,
    )  # fmt: skip


async def write_adapter(tp: TrainerProcess, tensors: dict[str, torch.Tensor]) -> tuple[dict, dict[str, torch.Tensor]]:
    """Ask the trainer to write its adapter into a segment laid out as a publisher lays out ``tensors`` (B scaled
    by 2, as a run's publisher scales it); its answer and what the segment then holds."""
    from multiprocessing import shared_memory

    from agentrl.weight_sync.inplace import layout_views, pack_layout

    layout, nbytes = pack_layout(tensors)
    shm = shared_memory.SharedMemory(create=True, size=nbytes)
    try:
        res = await tp.write_adapter(layout, shm.name, nbytes, 2.0)
        held = torch.frombuffer(bytearray(shm.buf[:nbytes]), dtype=torch.uint8)
    finally:
        shm.close()
        shm.unlink()
    return res, {n: v for (n, *_), v in zip(layout, layout_views(held, layout), strict=True)}


@pytest.fixture(scope="module")
def runs(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Drive a 1-rank and a 2-rank LoRA trainer through the same requests (policy versions 0, 1, ...)."""
    require(torch.distributed.is_available(), "torch.distributed is not available")
    cfg = lora_config(tiny_model)
    batch = make_batch()
    root = tmp_path_factory.mktemp("trainer-runs")
    r: dict[str, Any] = {"root": root}

    async def drive() -> None:
        with TrainerProcess(cfg, root / "w1", nproc=1, env=ENV) as tp:
            r["w1_info"] = tp.info
            r["w1"] = [await tp.train(batch, policy_version=v) for v in range(2)]
            r["w1_saved"] = await tp.save_adapter(root / "w1" / "adapter")
            r["w1_tensors"] = await tp.get_adapter_tensors()
            r["w1_written"] = await write_adapter(tp, r["w1_tensors"])
            await tp.save_checkpoint(root / "w1" / "ckpt")
            r["w1_more"] = [await tp.train(batch, policy_version=v) for v in range(2, 5)]
            with pytest.raises(TrainerError, match="unknown op"):
                tp.request(Request(), timeout_s=60)  # a request type the worker has no handler for
            with pytest.raises(TrainerError, match="malformed request"):
                tp.request(cast(Any, {"op": "ping"}), timeout_s=60)  # no request at all (the old wire format)
            r["w1_ping"] = tp.request(Ping(), timeout_s=60).result
        assert tp.proc is not None and tp.proc.returncode == 0
        with TrainerProcess(cfg, root / "w2", nproc=2, env=ENV) as tp:
            r["w2_info"] = tp.info
            r["w2"] = [await tp.train(batch, policy_version=v) for v in range(2)]
            await tp.save_adapter(root / "w2" / "adapter")
            r["w2_tensors"] = await tp.get_adapter_tensors()
            r["w2_written"] = await write_adapter(tp, r["w2_tensors"])
            r["w2_logprobs"] = await tp.logprobs(batch)
            await asyncio.sleep(1.0)  # idle: rank 0 sends heartbeats that the other rank must absorb
            await tp.train(batch, policy_version=2)  # move away from the checkpointed state ...
            r["w2_loaded"] = await tp.load_checkpoint(root / "w1" / "ckpt")  # ... and back (saved by 1 rank)
            r["w2_resumed"] = [await tp.train(batch, policy_version=v) for v in range(2, 4)]
        padded = cfg.model_copy(update={"packing": False, "balance_ranks": False})
        with TrainerProcess(padded, root / "w2-padded", nproc=2, env=ENV) as tp:
            r["w2_padded"] = [await tp.train(batch, policy_version=v) for v in range(2)]
            r["w2_padded_tensors"] = await tp.get_adapter_tensors()

    asyncio.run(drive())
    return r


def test_one_and_two_ranks_agree(runs: dict[str, Any]) -> None:
    assert runs["w1_info"]["world_size"] == 1 and runs["w2_info"]["world_size"] == 2
    for m1, m2 in zip(runs["w1"], runs["w2"], strict=True):
        assert m1["loss"] == pytest.approx(m2["loss"], rel=1e-5)
        assert m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-5)
        assert m1["num_tokens"] == m2["num_tokens"] == 65
        assert m1["optimizer_step"] == m2["optimizer_step"]
        for key in ("is_weight_mean", "kl", "clip_frac"):
            assert m1[key] == pytest.approx(m2[key], rel=1e-4, abs=1e-7)
    assert runs["w1"][1]["optimizer_step"] == 4, "2 minibatches per call: 2 optimizer steps per call"
    assert [m["staleness_mean"] for m in runs["w1"]] == [0.0, 1.0], "against the policy version, not the steps"
    assert runs["w1"][0]["is_weight_mean"] != 1.0, "the batch is off-policy"
    t1, t2 = runs["w1_tensors"], runs["w2_tensors"]
    assert sorted(t1) == sorted(t2)
    for name in t1:
        torch.testing.assert_close(t1[name], t2[name], rtol=0, atol=1e-6, msg=name)
    # The test is only meaningful if the adapters moved away from their (zero-B) initialisation.
    assert max(t.abs().max().item() for k, t in t1.items() if "lora_B" in k) > 1e-4


def test_packed_rows_and_balanced_ranks_train_as_padded_strided_ones(runs: dict[str, Any]) -> None:
    """The defaults (rows packed under the token budget, ranks dealt by cost) against padded micro-batches
    dealt ``rank::world``: the same losses, gradient norms and adapters on two ranks."""
    for packed, padded in zip(runs["w2"], runs["w2_padded"], strict=True):
        for key in ("loss", "grad_norm", "kl", "is_weight_mean"):
            assert packed[key] == pytest.approx(padded[key], rel=1e-5, abs=1e-7), key
        assert packed["num_tokens"] == padded["num_tokens"]
    for name, t in runs["w2_tensors"].items():
        torch.testing.assert_close(runs["w2_padded_tensors"][name], t, rtol=0, atol=1e-6, msg=name)


def test_loss_decreases_with_positive_advantages(runs: dict[str, Any]) -> None:
    metrics = runs["w1"] + runs["w1_more"]
    losses = [m["loss"] for m in metrics]
    logps = [m["logp_mean"] for m in metrics]
    assert losses[-1] < losses[0] - 0.05, losses
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    assert logps[-1] > logps[0], logps
    assert (metrics[-1]["optimizer_step"], metrics[-1]["policy_version"]) == (10, 4)
    assert metrics[-1]["staleness_mean"] == 4.0, "tokens of policy 0 trained as policy 4"
    assert runs["w1_ping"]["optimizer_step"] == 10, "a failed op leaves the worker serving"


def test_checkpoint_resume_across_world_sizes(runs: dict[str, Any]) -> None:
    assert runs["w2_loaded"]["optimizer_step"] == 4
    for resumed, original in zip(runs["w2_resumed"], runs["w1_more"], strict=False):
        assert resumed["optimizer_step"] == original["optimizer_step"]
        assert resumed["loss"] == pytest.approx(original["loss"], rel=1e-5)
        assert resumed["grad_norm"] == pytest.approx(original["grad_norm"], rel=1e-5)


def test_logprobs_op_on_two_ranks(runs: dict[str, Any]) -> None:
    """``logprobs`` returns every sample's per-token logprobs in order, whichever rank scored it."""
    got = runs["w2_logprobs"]
    assert [len(g) for g in got] == [len(s.input_ids) for s in make_batch()]
    assert all(g[0] == 0.0 and all(x <= 0.0 for x in g) for g in got)
    assert len({round(g[-1], 6) for g in got}) > 1


def test_saved_adapter_loads_with_peft(runs: dict[str, Any], tiny_model: Path) -> None:
    peft = pytest.importorskip("peft")
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    adapter = Path(runs["w1_saved"]["path"])
    assert runs["w1_saved"]["bytes"] > 0
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["r"] == 16 and config["lora_alpha"] == 32
    linear = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
              "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
    assert set(config["target_modules"]) == set(linear)  # the default: every linear layer
    assert config["base_model_name_or_path"] == str(tiny_model)
    saved = load_file(str(adapter / "adapter_model.safetensors"))
    expected = {
        f"base_model.model.model.layers.{i}.{linear[m]}.{m}.lora_{ab}.weight"
        for i in range(2) for m in linear for ab in "AB"
    }  # fmt: skip
    assert set(saved) == expected
    for name, t in saved.items():
        torch.testing.assert_close(t, runs["w1_tensors"][name], rtol=0, atol=0)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, str(adapter))
    loaded = {k.replace(".default", ""): v for k, v in model.state_dict().items() if "lora_" in k}
    assert set(loaded) == expected
    for name, t in loaded.items():
        torch.testing.assert_close(t, saved[name], rtol=0, atol=0)
    ids = torch.tensor([make_batch()[0].input_ids])
    with torch.no_grad():
        tuned = model(input_ids=ids).logits
        with model.disable_adapter():
            plain = model(input_ids=ids).logits
    assert (tuned - plain).abs().max().item() > 1e-4


async def test_full_finetune_step_and_save(tiny_model: Path, tmp_path: Path) -> None:
    """Full fine-tune with gradient checkpointing on two ranks (tied embeddings trained and saved whole),
    driven through the async API as the train loop does."""
    from safetensors.torch import load_file

    cfg = TrainerConfig(
        model_path=str(tiny_model), lora=False, lr=1e-4, gradient_checkpointing=True, micro_batch_tokens=64,
        loss={"is_correction": "none"},
    )  # fmt: skip
    tp = TrainerProcess(cfg, tmp_path / "full", nproc=2, env=ENV)  # two ranks: rank 1 gets its shards from rank 0
    await asyncio.to_thread(tp.start)
    try:
        assert tp.info["trainable_params"] > 100_000
        metrics = await tp.train(make_batch(), policy_version=0)
        saved = await tp.save_adapter(tmp_path / "full" / "model")
    finally:
        assert await tp.aclose() == 0
    assert "ok" not in metrics and "id" not in metrics
    assert metrics["optimizer_step"] == 1 and torch.isfinite(torch.tensor(metrics["loss"]))
    out = Path(saved["path"])
    assert (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file()
    assert json.loads((out / "config.json").read_text())["use_cache"] is True  # off only while training
    assert json.loads((out / "generation_config.json").read_text()) == json.loads(
        (tiny_model / "generation_config.json").read_text())
    new = load_file(str(out / "model.safetensors"))
    old = load_file(str(tiny_model / "model.safetensors"))
    # gathered from two ranks, the tied output embedding is written out too, equal to the input one
    assert set(new) - set(old) <= {"lm_head.weight"} and set(old) <= set(new)
    if "lm_head.weight" in new:
        torch.testing.assert_close(new["lm_head.weight"], new["model.embed_tokens.weight"], rtol=0, atol=0)
    assert max((new[k] - old[k]).abs().max().item() for k in old) > 1e-5
    assert (tmp_path / "full" / "trainer.pid").read_text().strip().isdigit()


def test_two_nodes_match_one_node_of_the_same_size(runs: dict[str, Any], tiny_model: Path, tmp_path: Path) -> None:
    """Two torchrun launchers of one rank each give the same losses as one node with two ranks. The second
    node is another host: a network namespace behind a veth pair, with a ``/dev/shm`` of its own, which
    joins with `agentrl trainer-node` (c10d rendezvous, gloo and rank 0's connection to the orchestrator all
    cross the link)."""
    import os
    import subprocess
    import sys
    import threading

    from agentrl.trainer.launch import JOIN_FILE, _free_port
    from tests import hosts as hosts_mod

    missing = hosts_mod.missing()
    require(missing is None, f"cannot make hosts in network namespaces: {missing}")
    with hosts_mod.hosts(1) as (node1_host,):
        cfg = lora_config(tiny_model).model_copy(deep=True)
        cfg.distributed = cfg.distributed.model_validate({
            "nnodes": 2, "master_port": _free_port(), "master_addr": node1_host.here,
            "orchestrator_addr": node1_host.here})
        # gloo finds its own address through the interface named here (the hostname resolves to neither end)
        tp = TrainerProcess(cfg, tmp_path / "node0", nproc=1, env={**ENV, "GLOO_SOCKET_IFNAME": node1_host.link})
        started: dict[str, Any] = {}
        t = threading.Thread(target=lambda: started.setdefault("info", tp.start()), daemon=True)
        t.start()
        join = tmp_path / "node0" / JOIN_FILE
        for _ in range(600):
            if join.is_file() or not t.is_alive():
                break
            threading.Event().wait(0.1)
        assert join.is_file(), "the first node writes the join file before it waits for rank 0"
        assert oct(join.stat().st_mode & 0o777) == "0o600", "the join file carries the key: owner only"
        node1 = subprocess.Popen(node1_host.command([
            sys.executable, "-m", "agentrl.cli", "trainer-node", "--join", str(join), "--work-dir",
            str(tmp_path / "node1"), "--local-addr", node1_host.addr]), env={**os.environ, **ENV, "GLOO_SOCKET_IFNAME": node1_host.ifname},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            t.join(300)
            assert started.get("info", {}).get("world_size") == 2, (started, tp.log_tail())
            batch = make_batch()

            async def drive() -> list[dict[str, Any]]:
                return [await tp.train(batch, policy_version=v) for v in range(2)]

            two_nodes = asyncio.run(drive())
            for m2, mn in zip(runs["w2"], two_nodes, strict=True):
                assert mn["loss"] == pytest.approx(m2["loss"], rel=1e-5)
                assert mn["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-5)
                assert mn["num_tokens"] == m2["num_tokens"]
        finally:
            tp.close()
            try:
                out, _ = node1.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(node1.pid, 9)
                out, _ = node1.communicate()
        assert node1.returncode == 0, out.decode(errors="replace")[-3000:]


async def test_lora_with_norms_and_embedding_trained_whole_saves_and_resumes(tiny_model: Path, tmp_path: Path) -> None:
    """``trainer.lora_train_norms`` and ``trainer.lora_train_embedding`` on two ranks: the adapter's tensors carry
    the norms and the tied embedding whole (gathered from their shards), the saved adapter is peft's (its merge
    scores as the trainer does), and a checkpoint resumes on one rank into the same steps."""
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    cfg = lora_config(tiny_model).model_copy(update={"lora_train_norms": True, "lora_train_embedding": True})
    batch = make_batch()
    with TrainerProcess(cfg, tmp_path / "w2", nproc=2, env=ENV) as tp:
        await tp.train(batch, policy_version=0)
        await tp.save_checkpoint(tmp_path / "ckpt")
        more = [await tp.train(batch, policy_version=v) for v in range(1, 3)]
        tensors = await tp.get_adapter_tensors()
        saved = await tp.save_adapter(tmp_path / "adapter")
        logprobs = await tp.logprobs(batch[:1])
    whole = sorted(n for n in tensors if ".lora_" not in n)
    assert whole[0] == "base_model.model.model.embed_tokens.weight" and len(whole) == 1 + 2 * 2 + 1, whole
    base = _model_tensors(tiny_model)
    assert not torch.allclose(tensors[whole[0]], base["model.embed_tokens.weight"])
    model = peft.PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32), saved["path"]).merge_and_unload()
    ids = torch.tensor([batch[0].input_ids])
    with torch.no_grad():
        logp = model(input_ids=ids).logits[0, :-1].log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
    torch.testing.assert_close(logp, torch.tensor(logprobs[0][1:]), rtol=0, atol=1e-4)
    with TrainerProcess(cfg, tmp_path / "w1", nproc=1, env=ENV) as tp:
        await tp.load_checkpoint(tmp_path / "ckpt")
        resumed = [await tp.train(batch, policy_version=v) for v in range(1, 3)]
    for got, want in zip(resumed, more, strict=True):
        assert got["optimizer_step"] == want["optimizer_step"]
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)


def _model_tensors(model: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(model / "model.safetensors"))


def test_one_rank_writes_its_adapter_into_the_publishers_segment(runs: dict[str, Any]) -> None:
    """One rank writes the adapter straight into the publisher's segment (no copy across its connection): what the
    segment holds is what the gather returned, B scaled; several ranks decline and the publisher gathers."""
    res, held = runs["w1_written"]
    assert res["written"] is True and res["write_ms"] >= 0
    assert set(held) == set(runs["w1_tensors"])
    for name, t in runs["w1_tensors"].items():
        assert torch.equal(held[name], t * 2.0 if ".lora_B." in name else t), name
    assert runs["w2_written"][0]["written"] is False
