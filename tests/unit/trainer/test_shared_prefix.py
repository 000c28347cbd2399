"""Shared prompts in packed rows: samples that open on the same prompt hold it once, and the logprobs, the loss
and the gradients equal those of each sample packed whole (LoRA and full weights, either output layer)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from agentrl.core.types import TrainSample
from agentrl.trainer.packing import (
    MIN_SHARED,
    collate_packed,
    families,
    family_tokens,
    pack_shared,
    shared_len,
)
from tests.unit.trainer.test_packing import StepResult, _make_step, assert_same_step, step_result


def _sample(rng: random.Random, prompt: list[int], n_after: int, temperature: float = 1.0) -> TrainSample:
    rest = [rng.randrange(3, 300) for _ in range(n_after)]
    mask = [0] * len(prompt) + [1 if k % 5 != 4 else 0 for k in range(n_after)]  # a tool result now and then
    ids = prompt + rest
    return TrainSample(input_ids=ids, loss_mask=mask, behav_logprobs=[rng.uniform(-6.0, -4.0) if m else 0.0 for m in mask],
                       advantage=rng.uniform(-1.0, 1.0), versions=[0 if m else -1 for m in mask], temperature=temperature)


def _batch(rng: random.Random) -> list[TrainSample]:
    p1 = [rng.randrange(3, 300) for _ in range(30)]
    p2 = [rng.randrange(3, 300) for _ in range(25)]
    short = [rng.randrange(3, 300) for _ in range(MIN_SHARED - 2)]  # too short to share
    return [_sample(rng, p1, 12), _sample(rng, p2, 7, 0.7), _sample(rng, p1, 20), _sample(rng, short, 9),
            _sample(rng, p1, 4), _sample(rng, p2, 15, 0.7), _sample(rng, short, 3)]


def test_families_group_samples_by_their_prompt() -> None:
    samples = _batch(random.Random(1))
    assert [shared_len(s) for s in samples] == [29, 24, 29, 0, 29, 24, 0]
    assert families(samples) == [[0, 2, 4], [1, 5], [3], [6]]
    assert family_tokens([42, 50, 33], 29) == 29 + 13 + 21 + 4 and family_tokens([42], 29) == 42


def test_pack_shared_keeps_rows_under_the_budget_and_every_index_once() -> None:
    samples = _batch(random.Random(2))
    for budget in (60, 80, 200):
        rows = pack_shared(samples, budget)
        assert sorted(i for r in rows for i in r) == list(range(len(samples)))
        for row in rows:
            b = collate_packed([samples[i] for i in row], 0, share=True)
            assert b["input_ids_1_P"].shape[1] <= budget
    one = pack_shared(samples, 200)
    assert len(one) == 1 and collate_packed(samples, 0, share=True)["input_ids_1_P"].shape[1] < sum(
        len(s.input_ids) for s in samples)


def test_the_shared_row_lays_prompts_once_and_maps_every_position_back() -> None:
    samples = _batch(random.Random(3))
    b = collate_packed(samples, 0, share=True)
    ids, lay, unpack = b["input_ids_1_P"][0], b["prefix_layout_S_4"], b["unpack_B_T"]
    for i, s in enumerate(samples):
        n = len(s.input_ids)
        assert ids[unpack[i, :n]].tolist() == s.input_ids, "every position maps to its own token"
        _p0, q, s0, m = lay[i].tolist()
        assert q + m == n and b["position_ids_1_P"][0, s0:s0 + m].tolist() == list(range(q, n))
    assert b["starts_S"].tolist() == sorted({row[0] for row in lay.tolist()})


@pytest.mark.parametrize("chunk", [0, 7], ids=["own-head", "fused-head"])
@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_shared_prompts_give_the_same_logprobs_loss_and_gradients(world: None, tiny_tokenizer_model: Path,
                                                                 lora: bool, chunk: int) -> None:
    samples = _batch(random.Random(4))
    n_tok = sum(s.num_loss_tokens for s in samples)
    results: list[StepResult] = []
    for share in (False, True):
        step = _make_step(tiny_tokenizer_model, lora=lora, share_prefix=share, logprob_chunk_tokens=chunk)
        assert step.share_prefix is share
        batch = step._batch(samples)
        assert ("prefix_layout_S_4" in batch) is share
        results.append(step_result(step, batch, n_tok))
    assert_same_step(*results)


def test_a_step_with_shared_prompts_trains(world: None, tiny_tokenizer_model: Path) -> None:
    step = _make_step(tiny_tokenizer_model, micro_batch_tokens=64)
    samples = _batch(random.Random(5))
    out = step.train(samples, policy_version=0)
    assert out["num_tokens"] == sum(s.num_loss_tokens for s in samples) and out["grad_norm"] > 0
    scored = step.score(samples)
    assert [len(x) for x in scored] == [len(s.input_ids) for s in samples] and all(x[0] == 0.0 for x in scored)
