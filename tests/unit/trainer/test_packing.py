"""Packing and rank balancing: the pure logic, and the trainer's step in-process (a one-rank gloo world,
a random tiny model), where a packed micro-batch gives the padded one's logprobs, loss and gradients."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.config.trainer import TrainerConfig
from agentrl.core.types import TrainSample
from agentrl.trainer.attention import VARLEN_SDPA
from agentrl.trainer.batch import collate
from agentrl.trainer.loss import policy_loss, token_logprobs
from agentrl.trainer.packing import (
    TooLongForBudget,
    attention_len,
    balance,
    collate_packed,
    pack,
    packed_token_logprobs,
    sequence_cost,
    strided,
)


def test_pack_fills_rows_under_the_budget_with_every_index_once() -> None:
    rng = random.Random(0)
    lengths = [rng.randint(1, 100) for _ in range(200)]
    rows = pack(lengths, 128)
    assert sorted(i for row in rows for i in row) == list(range(200))
    assert all(sum(lengths[i] for i in row) <= 128 for row in rows)
    assert all(row == sorted(row) for row in rows)
    # first-fit decreasing is within 11/9 OPT + 1 rows; the volume bound is a lower bound of OPT
    assert len(rows) <= 11 / 9 * (sum(lengths) / 128 + 1) + 1
    assert pack(lengths, 128) == rows, "deterministic"


def test_pack_puts_small_samples_beside_a_long_one() -> None:
    assert pack([100, 20, 8, 30], 128) == [[0, 1, 2], [3]]
    assert pack([128], 128) == [[0]] and pack([], 64) == []


def test_a_sample_over_the_budget_is_refused_naming_both_settings() -> None:
    with pytest.raises(TooLongForBudget, match=r"129 tokens.*micro_batch_tokens = 128.*max_context_tokens"):
        pack([10, 129], 128)
    with pytest.raises(ValueError, match="positive"):
        pack([1], 0)


def test_balance_deals_largest_first_to_the_least_loaded_rank() -> None:
    costs = [10.0, 1.0, 9.0, 2.0, 8.0, 3.0]
    ranks = balance(costs, 2)
    assert sorted(i for r in ranks for i in r) == list(range(6))
    loads = [sum(costs[i] for i in r) for r in ranks]
    assert max(loads) / (sum(loads) / 2) < 1.1
    strided_loads = [sum(costs[i] for i in r) for r in strided(6, 2)]
    assert strided_loads == [27.0, 6.0]
    assert balance(costs, 2) == ranks and balance([], 3) == [[], [], []]
    assert balance([5.0], 3) == [[0], [], []]


def test_sequence_cost_grows_quadratically_past_the_attention_length() -> None:
    assert sequence_cost(100, float("inf")) == 100
    assert sequence_cost(1000, 1000.0) == 2000 and sequence_cost(2000, 1000.0) == 6000

    class Qwen05:
        hidden_size, num_attention_heads, num_key_value_heads, head_dim, intermediate_size = 896, 14, 2, 64, 4864

    assert 16_000 < attention_len(Qwen05()) < 17_000
    assert attention_len(object()) == float("inf")


def _sample(rng: random.Random, n: int, temperature: float = 1.0) -> TrainSample:
    prompt = max(1, n // 3)
    mask = [0] * prompt + [1] * (n - prompt)
    return TrainSample(input_ids=[rng.randrange(3, 300) for _ in range(n)], loss_mask=mask,
                       behav_logprobs=[rng.uniform(-6.0, -4.0) if m else 0.0 for m in mask],
                       advantage=rng.uniform(-1.0, 1.0), versions=[0 if m else -1 for m in mask],
                       temperature=temperature)


def test_collate_packed_lays_samples_end_to_end_and_maps_back() -> None:
    rng = random.Random(1)
    samples = [_sample(rng, 5), _sample(rng, 3, temperature=0.5), _sample(rng, 4)]
    b = collate_packed(samples, pad_id=0)
    assert b["input_ids_1_P"].shape == (1, 12)
    assert b["position_ids_1_P"][0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]
    assert b["cu_seq_lens_S1"].tolist() == [0, 5, 8, 12]
    assert b["temperatures_P"].tolist() == [1.0] * 5 + [0.5] * 3 + [1.0] * 4
    # every real padded position reads its own token back from the row
    gathered = b["input_ids_1_P"][0][b["unpack_B_T"]] * b["attention_mask_B_T"]
    assert torch.equal(gathered, b["input_ids_B_T"] * b["attention_mask_B_T"])
    padded = collate(samples, pad_id=0)
    for key in ("loss_mask_B_T", "behav_logprobs_B_T", "versions_B_T", "advantages_B", "temperatures_B"):
        assert torch.equal(b[key], padded[key]), key


def test_packed_logprobs_are_each_samples_own() -> None:
    """With attention kept inside each sample, the row's logits at a sample's positions are that sample's
    alone: here the same random logits, laid out padded and packed."""
    rng = random.Random(2)
    samples = [_sample(rng, 7), _sample(rng, 2, temperature=0.7), _sample(rng, 5)]
    b = collate_packed(samples, pad_id=0)
    gen = torch.Generator().manual_seed(0)
    logits_B_T_V = torch.randn((3, 7, 300), generator=gen)
    ref_B_T = token_logprobs(logits_B_T_V, b["input_ids_B_T"], b["temperatures_B"])
    logits_P_V = torch.cat([logits_B_T_V[i, :n] for i, n in enumerate([7, 2, 5])])
    got_P = packed_token_logprobs(logits_P_V, b["input_ids_1_P"][0], b["temperatures_P"],
                                  b["cu_seq_lens_S1"][:-1], chunk=4)
    got_B_T = got_P[b["unpack_B_T"]] * b["attention_mask_B_T"]
    torch.testing.assert_close(got_B_T, ref_B_T * b["attention_mask_B_T"], rtol=0, atol=1e-6)
    assert got_P[[0, 7, 9]].tolist() == [0.0, 0.0, 0.0]


def _make_step(model_dir: Path, device: str = "cpu", **kw: object):
    from torch.distributed.device_mesh import init_device_mesh

    from agentrl.trainer import model as model_io
    from agentrl.trainer.train_step import TrainStep

    cfg = TrainerConfig(model_path=str(model_dir), lr=1e-3, device=device, **kw)  # type: ignore[arg-type]
    model = model_io.build_model(cfg, init_device_mesh(device, (1,)), torch.device(device))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    return TrainStep(model, opt, cfg, torch.device(device))


StepResult = tuple[torch.Tensor, float, dict[str, torch.Tensor]]
"""One step's logprobs of the loss tokens (zero elsewhere), loss and gradients."""


def step_result(step: Any, batch: dict[str, torch.Tensor], num_tokens: int) -> StepResult:
    """Score ``batch``, take its policy loss over ``num_tokens`` loss tokens and backpropagate it."""
    logp = step._logprobs(batch)
    assert logp.shape == batch["attention_mask_B_T"].shape
    loss, _ = policy_loss(logp, batch["behav_logprobs_B_T"], batch["advantages_B"], batch["loss_mask_B_T"],
                          step.cfg.loss, num_tokens_global=num_tokens)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in step.model.named_parameters() if p.grad is not None}
    return logp.detach() * batch["loss_mask_B_T"], float(loss.detach()), grads


def assert_same_step(a: StepResult, b: StepResult) -> None:
    """Two ways of computing one step agree: logprobs, loss and every gradient."""
    torch.testing.assert_close(b[0], a[0], rtol=0, atol=2e-5)
    assert b[1] == pytest.approx(a[1], rel=1e-5)
    assert sorted(a[2]) == sorted(b[2]) and a[2]
    for name, g in a[2].items():
        torch.testing.assert_close(b[2][name], g, rtol=1e-4, atol=1e-6, msg=name)


DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                              reason="no CUDA device"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_packed_and_padded_give_the_same_loss_and_gradients(world: None, tiny_tokenizer_model: Path,
                                                            lora: bool, device: str) -> None:
    rng = random.Random(3)
    samples = [_sample(rng, n, temperature=t) for n, t in [(40, 1.0), (9, 0.8), (23, 1.0), (3, 1.0)]]
    n_tok = sum(s.num_loss_tokens for s in samples)
    results: list[StepResult] = []
    for packing in (False, True):
        step = _make_step(tiny_tokenizer_model, device, lora=lora, packing=packing)
        if packing:
            assert step.model.config._attn_implementation == VARLEN_SDPA
        batch = step._batch(samples)
        assert ("input_ids_1_P" in batch) is packing
        results.append(step_result(step, batch, n_tok))
    assert_same_step(*results)


def test_a_packed_step_trains_and_refuses_a_sample_over_the_budget(world: None, tiny_tokenizer_model: Path) -> None:
    rng = random.Random(4)
    step = _make_step(tiny_tokenizer_model, micro_batch_tokens=48)
    samples = [_sample(rng, n) for n in (40, 30, 8, 17, 5, 12)]
    assert len(step._plan(samples)) == 3, "40+8, 30+17, 5+12 (first-fit decreasing)"
    out = step.train(samples, policy_version=0)
    assert out["num_tokens"] == sum(s.num_loss_tokens for s in samples) and out["grad_norm"] > 0
    with pytest.raises(TooLongForBudget, match="49 tokens"):
        step.train([_sample(rng, 49)], policy_version=1)


def test_varlen_sdpa_keeps_samples_apart_and_inside_the_window() -> None:
    import torch.nn.functional as F

    from agentrl.trainer.attention import varlen_sdpa

    gen = torch.Generator().manual_seed(0)
    q = torch.randn((1, 4, 12, 8), generator=gen)
    k, v = torch.randn((1, 2, 12, 8), generator=gen), torch.randn((1, 2, 12, 8), generator=gen)
    seg = torch.tensor([0] * 5 + [1] * 7)
    causal = torch.ones(12, 12, dtype=torch.bool).tril()
    block = causal & (seg[:, None] == seg[None, :])
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=block)
    ref = ref.transpose(1, 2)
    module = torch.nn.Module()
    module.num_key_value_groups = 2  # what transformers' SDPA reads on the fallback path
    by_cu, _ = varlen_sdpa(module, q, k, v, None, cu_seq_lens_q=torch.tensor([0, 5, 12], dtype=torch.int32))
    pos = torch.cat([torch.arange(5), torch.arange(7)])[None]
    by_pos, _ = varlen_sdpa(module, q, k, v, None, position_ids=pos)
    torch.testing.assert_close(by_cu, ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(by_pos, ref, rtol=0, atol=1e-6)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    whole, _ = varlen_sdpa(module, q, k, v, None, position_ids=torch.arange(12)[None])
    torch.testing.assert_close(whole, F.scaled_dot_product_attention(q, kk, vv, is_causal=True).transpose(1, 2),
                               rtol=0, atol=1e-6)
    assert (whole - ref).abs().max() > 1e-3, "one sample: causal over the whole row"
    # a sliding window of 3: the 7-token sample is banded, the 5-token one too
    idx = torch.arange(12)
    band = block & (idx[:, None] - idx[None, :] < 3)
    windowed, _ = varlen_sdpa(module, q, k, v, None, position_ids=pos, sliding_window=3)
    torch.testing.assert_close(windowed, F.scaled_dot_product_attention(q, kk, vv, attn_mask=band).transpose(1, 2),
                               rtol=0, atol=1e-6)
    wide, _ = varlen_sdpa(module, q, k, v, None, position_ids=pos, sliding_window=7)
    torch.testing.assert_close(wide, ref, rtol=0, atol=1e-6)
