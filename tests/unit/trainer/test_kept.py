"""Sampling-mask replay in the trainer: a position with a recorded kept set is scored under the distribution
renormalised over that set, equal to a direct masked log-softmax of the model's logits, with the same logprobs,
loss and gradients through the fused or the plain output layer, packed, padded or with shared prompts."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from agentrl.core.masks import SamplingMask, encode_row
from agentrl.core.types import TrainSample
from agentrl.trainer.errors import BatchError
from agentrl.trainer.head import chunked_logprobs
from agentrl.trainer.kept import collate_kept, mask_logits
from tests.unit.trainer.test_packing import StepResult, _make_step, assert_same_step, step_result
from tests.unit.trainer.test_shared_prefix import _batch


def _masked(sample: TrainSample, vocab: int, rng: random.Random) -> TrainSample:
    """``sample`` with a kept set recorded at most of its loss tokens: the token itself and a random few
    (top-k-like), or all but a random few (top-p-like at a flat distribution)."""
    mask = SamplingMask(vocab=vocab)
    for t, (tok, m) in enumerate(zip(sample.input_ids, sample.loss_mask, strict=True)):
        if not m or t % 4 == 3:
            mask.pad(1)
            continue
        kept = np.zeros(vocab, dtype=bool)
        kept[rng.sample(range(vocab), rng.choice([1, 5, 40, vocab - 30]))] = True
        kept[tok] = True
        count, data = encode_row(kept, vocab)
        mask.extend([count], data)
    return dataclasses.replace(sample, sampling_mask=mask)


def test_chunked_logprobs_renormalise_over_the_kept_set_with_exact_gradients() -> None:
    g = torch.Generator().manual_seed(0)
    N, V = 29, 50
    hidden = torch.randn(N, 16, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(V, 16, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, V, (N,), generator=g)
    inv_temp = torch.full((N,), 1 / 0.7, dtype=torch.float64)
    kept = torch.rand(N, V, generator=g) < 0.3
    kept[torch.arange(N), target] = True
    rows = torch.arange(N)
    rows[::3] = -1  # every third position: nothing cut
    upstream = torch.randn(N, generator=g, dtype=torch.float64)
    logits = (hidden @ weight.T) * inv_temp[:, None]
    masked = torch.where((rows[:, None] >= 0) & ~kept[rows.clamp(min=0)], float("-inf"), logits)
    ref = torch.log_softmax(masked, -1).gather(-1, target[:, None]).squeeze(-1)
    (ref * upstream).sum().backward()
    ref_h, ref_w = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    got = chunked_logprobs(hidden, weight, target, inv_temp, chunk=8, kept_row_N=rows, kept_M_V=kept)
    (got * upstream).sum().backward()
    torch.testing.assert_close(got, ref.float(), rtol=0, atol=1e-5)
    torch.testing.assert_close(hidden.grad, ref_h, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weight.grad, ref_w, rtol=1e-5, atol=1e-6)
    plain = torch.log_softmax(logits, -1).gather(-1, target[:, None]).squeeze(-1)
    assert (ref[rows >= 0] > plain[rows >= 0]).all(), "renormalising over a strict subset raises every logprob"
    assert torch.equal(ref[rows < 0], plain[rows < 0])


def test_masks_of_another_vocabulary_are_refused() -> None:
    with pytest.raises(BatchError, match="another model"):
        mask_logits(torch.zeros(2, 10), torch.tensor([0, -1]), torch.ones(1, 12, dtype=torch.bool))


def test_collate_lays_each_kept_set_at_its_position() -> None:
    rng = random.Random(0)
    samples = [_masked(s, 300, rng) for s in _batch(random.Random(1))[:3]]
    out = collate_kept(samples, max(len(s.input_ids) for s in samples))
    rows, kept = out["kept_row_B_T"], out["kept_M_V"]
    for b, s in enumerate(samples):
        assert s.sampling_mask is not None
        for t, want in s.sampling_mask.rows():
            assert torch.equal(kept[rows[b, t]], torch.from_numpy(want))
        assert int((rows[b] >= 0).sum()) == s.sampling_mask.masked
    assert collate_kept([dataclasses.replace(s, sampling_mask=None) for s in samples], 50) == {}


@pytest.mark.parametrize("layout", ["padded", "packed", "shared"])
@pytest.mark.parametrize("chunk", [0, 7], ids=["own-head", "fused-head"])
def test_every_layout_scores_the_masked_distribution(world: None, tiny_tokenizer_model: Path, layout: str,
                                                     chunk: int) -> None:
    step = _make_step(tiny_tokenizer_model, lora=True, packing=layout != "padded", share_prefix=layout == "shared",
                      logprob_chunk_tokens=chunk)
    vocab = step.model.config.vocab_size
    rng = random.Random(7)
    samples = [_masked(s, vocab, rng) for s in _batch(random.Random(4))]
    n_tok = sum(s.num_loss_tokens for s in samples)
    batch = step._batch(samples)
    got = step_result(step, batch, n_tok)
    # the reference: the padded plain forward, its logits masked by hand
    ref_step = _make_step(tiny_tokenizer_model, lora=True, packing=False, logprob_chunk_tokens=0)
    plain = ref_step._batch(samples)
    with torch.no_grad():
        logits = ref_step.model(input_ids=plain["input_ids_B_T"], attention_mask=plain["attention_mask_B_T"]).logits
    for b, s in enumerate(samples):
        assert s.sampling_mask is not None
        lp = torch.log_softmax(logits[b].float() / s.temperature, -1)
        for t, kept in s.sampling_mask.rows():
            row = logits[b, t - 1].float() / s.temperature
            want = torch.log_softmax(row.masked_fill(~torch.from_numpy(kept), float("-inf")), -1)[s.input_ids[t]]
            assert float(got[0][b, t]) == pytest.approx(float(want), abs=2e-5)
            assert float(got[0][b, t]) > float(lp[t - 1, s.input_ids[t]])
    if layout != "padded" or chunk:  # the same step as the padded plain path, gradients included
        assert_same_step(step_result(ref_step, plain, n_tok), got)


def test_unmasked_samples_score_as_before(world: None, tiny_tokenizer_model: Path) -> None:
    step = _make_step(tiny_tokenizer_model, lora=True, packing=True, logprob_chunk_tokens=7)
    samples = _batch(random.Random(5))
    empty = [dataclasses.replace(s, sampling_mask=SamplingMask(vocab=step.model.config.vocab_size,
                                                               counts=[0] * len(s.input_ids))) for s in samples]
    a: StepResult = step_result(step, step._batch(samples), 1)
    b: StepResult = step_result(_make_step(tiny_tokenizer_model, lora=True, packing=True, logprob_chunk_tokens=7),
                                step._batch(empty), 1)
    assert "kept_M_V" not in step._batch(empty)
    assert_same_step(a, b)
