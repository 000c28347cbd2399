"""The fused output layer: next-token logprobs and their gradients equal the plain logits path, chunk by chunk,
at each sample's temperature, packed or padded, LoRA or full weights; and it never holds the logits."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from agentrl.trainer.head import chunked_logprobs, fusable
from tests.unit.trainer.test_packing import StepResult, _make_step, _sample, assert_same_step, step_result


def test_chunked_logprobs_and_gradients_equal_the_plain_log_softmax() -> None:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(37, 16, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 50, (37,), generator=g)
    inv_temp = 1.0 / torch.tensor([1.0, 0.7, 1.3] * 12 + [1.0], dtype=torch.float64)
    upstream = torch.randn(37, generator=g, dtype=torch.float64)
    ref = torch.log_softmax((hidden @ weight.T) * inv_temp[:, None], -1).gather(-1, target[:, None]).squeeze(-1)
    (ref * upstream).sum().backward()
    ref_h, ref_w = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    got = ChunkedInF64.apply(hidden, weight, target, inv_temp)
    (got * upstream).sum().backward()
    torch.testing.assert_close(got, ref.float(), rtol=0, atol=1e-5)
    torch.testing.assert_close(hidden.grad, ref_h, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weight.grad, ref_w, rtol=1e-5, atol=1e-6)


class ChunkedInF64:
    """The fused function on float64 inputs, in chunks of 8 rows (4 full chunks and a part)."""

    @staticmethod
    def apply(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, inv_temp: torch.Tensor) -> torch.Tensor:
        return chunked_logprobs(hidden, weight, target, inv_temp, chunk=8)


def test_a_frozen_output_layer_gets_no_gradient() -> None:
    hidden = torch.randn(5, 4, requires_grad=True)
    weight = torch.randn(9, 4)
    out = chunked_logprobs(hidden, weight, torch.zeros(5, dtype=torch.long), torch.ones(5), chunk=2)
    out.sum().backward()
    assert hidden.grad is not None and weight.grad is None


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "padded"])
@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_the_fused_head_gives_the_plain_logprobs_loss_and_gradients(world: None, tiny_tokenizer_model: Path,
                                                                   lora: bool, packing: bool) -> None:
    rng = random.Random(5)
    samples = [_sample(rng, n, temperature=t) for n, t in [(40, 1.0), (9, 0.8), (23, 1.0), (3, 0.6)]]
    n_tok = sum(s.num_loss_tokens for s in samples)
    results: list[StepResult] = []
    for chunk in (0, 7):  # 0: the model's own output layer over the whole micro-batch
        step = _make_step(tiny_tokenizer_model, lora=lora, packing=packing, logprob_chunk_tokens=chunk)
        assert step.fused_head is bool(chunk) and fusable(step.model)
        batch = step._batch(samples)
        results.append(step_result(step, batch, n_tok))
    assert_same_step(*results)
    # the output layer is its own again after the forward
    base = step.model.get_base_model() if lora else step.model
    assert isinstance(base.get_output_embeddings(), torch.nn.Linear)


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "padded"])
def test_the_fused_head_scores_the_loss_tokens_only_and_every_token_when_asked(world: None,
                                                                             tiny_tokenizer_model: Path,
                                                                             packing: bool) -> None:
    """In training only the positions that predict a loss token reach the output layer (their logprobs equal
    the plain path's, the rest are 0); scoring (``every``) gives every position the plain logprob."""
    rng = random.Random(11)
    samples = [_sample(rng, n, temperature=t) for n, t in [(33, 1.0), (14, 0.7), (8, 1.0)]]
    plain = _make_step(tiny_tokenizer_model, packing=packing, logprob_chunk_tokens=0)
    fused = _make_step(tiny_tokenizer_model, packing=packing, logprob_chunk_tokens=6)
    batch = plain._batch(samples)
    mask, real = batch["loss_mask_B_T"], batch["attention_mask_B_T"]
    with torch.no_grad():
        ref = plain._logprobs(batch) * real
        trained, every = fused._logprobs(batch), fused._logprobs(batch, every=True) * real
    torch.testing.assert_close(trained, ref * mask, rtol=0, atol=2e-5)
    torch.testing.assert_close(every, ref, rtol=0, atol=2e-5)
    prompt = real.bool() & ~mask.bool()
    prompt[:, 0] = False  # a sample's first token has no logprob on either path
    assert (every[prompt] != 0).all() and (trained[prompt] == 0).all()


def _randomise_lora_b(model: torch.nn.Module, seed: int) -> None:
    """Every LoRA B nonzero (peft starts them at zero), so that each adapter changes the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:  # a one-rank DTensor's local tensor is the whole parameter
                local = p.to_local() if hasattr(p, "to_local") else p
                local.copy_(torch.randn(p.shape, generator=g) * 0.05)


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "padded"])
def test_an_output_layer_lora_is_scored_and_trained_through_the_fused_head(world: None, tiny_tokenizer_model: Path,
                                                                          packing: bool) -> None:
    rng = random.Random(7)
    samples = [_sample(rng, n, temperature=t) for n, t in [(31, 1.0), (12, 0.7), (5, 1.0)]]
    n_tok = sum(s.num_loss_tokens for s in samples)
    results: list[StepResult] = []
    for chunk in (0, 5):
        step = _make_step(tiny_tokenizer_model, lora=True, lora_train_unembed=True, packing=packing,
                          logprob_chunk_tokens=chunk)
        _randomise_lora_b(step.model, 3)
        assert step.fused_head is bool(chunk)
        results.append(step_result(step, step._batch(samples), n_tok))
    assert_same_step(*results)
    head_grads = [n for n in results[1][2] if "lm_head.lora_" in n]
    assert len(head_grads) == 2 and all(results[1][2][n].abs().sum() > 0 for n in head_grads)
    # the head's adapter changes the logprobs: without it they differ
    step = _make_step(tiny_tokenizer_model, lora=True, packing=packing, logprob_chunk_tokens=5)
    _randomise_lora_b(step.model, 3)
    plain = step_result(step, step._batch(samples), n_tok)
    assert not torch.allclose(plain[0], results[1][0], atol=1e-4)


def test_the_output_layer_lora_is_left_out_with_the_adapters_disabled(tiny_tokenizer_model: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from agentrl.trainer.head import head_lora

    base = AutoModelForCausalLM.from_pretrained(str(tiny_tokenizer_model), dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "lm_head"]))
    _randomise_lora_b(model, 4)
    head = model.get_base_model().get_output_embeddings()
    hidden = torch.randn(6, head.weight.shape[1])
    side = head_lora(head, hidden)
    assert side is not None and side[0].shape == (6, 4) and side[1].shape == (head.weight.shape[0], 4)
    torch.testing.assert_close(hidden @ head.weight.T + side[0] @ side[1].T, head(hidden), rtol=1e-5, atol=1e-5)
    with model.disable_adapter():
        assert head_lora(head, hidden) is None


def test_the_side_term_gets_its_gradients_and_the_frozen_weight_none() -> None:
    """The output-layer LoRA's term in the fused function: logprobs and gradients (hidden, side, B) equal the
    plain log-softmax's; the frozen output weight gets no gradient (none is computed)."""
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(13, 16, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(30, 16, generator=g, dtype=torch.float64)
    side_h = torch.randn(13, 3, generator=g, dtype=torch.float64, requires_grad=True)
    side_w = torch.randn(30, 3, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 30, (13,), generator=g)
    inv_temp = torch.full((13,), 1 / 0.8, dtype=torch.float64)
    up = torch.randn(13, generator=g, dtype=torch.float64)
    logits = (hidden @ weight.T + side_h @ side_w.T) * inv_temp[:, None]
    ref = torch.log_softmax(logits, -1).gather(-1, target[:, None]).squeeze(-1)
    (ref * up).sum().backward()
    want = [t.grad.clone() for t in (hidden, side_h, side_w)]
    for t in (hidden, side_h, side_w):
        t.grad = None
    got = chunked_logprobs(hidden, weight, target, inv_temp, chunk=4, side=(side_h, side_w))
    (got * up).sum().backward()
    torch.testing.assert_close(got, ref.float(), rtol=0, atol=1e-5)
    for t, w in zip((hidden, side_h, side_w), want, strict=True):
        torch.testing.assert_close(t.grad, w, rtol=1e-5, atol=1e-6)
    assert weight.grad is None
