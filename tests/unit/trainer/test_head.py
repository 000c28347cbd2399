"""The fused output layer: next-token logprobs and their gradients equal the plain logits path, chunk by chunk,
at each sample's temperature, packed or padded, LoRA or full weights; and it never holds the logits."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from agentrl.trainer.head import chunked_logprobs, fusable
from agentrl.trainer.loss import policy_loss
from tests.unit.trainer.test_packing import _make_step, _sample


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
    logps, losses, grads = [], [], []
    for chunk in (0, 7):  # 0: the model's own output layer over the whole micro-batch
        step = _make_step(tiny_tokenizer_model, lora=lora, packing=packing, logprob_chunk_tokens=chunk)
        assert step.fused_head is bool(chunk) and fusable(step.model)
        batch = step._batch(samples)
        logp = step._logprobs(batch)
        assert logp.shape == batch["attention_mask_B_T"].shape
        loss, _ = policy_loss(logp, batch["behav_logprobs_B_T"], batch["advantages_B"], batch["loss_mask_B_T"],
                              step.cfg.loss, num_tokens_global=n_tok)
        loss.backward()
        logps.append(logp.detach() * batch["attention_mask_B_T"])
        losses.append(float(loss.detach()))
        grads.append({n: p.grad.detach().clone() for n, p in step.model.named_parameters() if p.grad is not None})
    torch.testing.assert_close(logps[1], logps[0], rtol=0, atol=2e-5)
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    assert sorted(grads[0]) == sorted(grads[1]) and grads[0]
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-4, atol=1e-6, msg=name)
    # the output layer is its own again after the forward
    base = step.model.get_base_model() if lora else step.model
    assert isinstance(base.get_output_embeddings(), torch.nn.Linear)
