"""The losses by name against values computed by hand, their config and their refusals."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.tinker import losses
from agentrl.tinker.errors import TinkerUserError

LP = torch.tensor([math.log(0.5), math.log(0.25), math.log(0.8)])
Q = torch.tensor([math.log(0.5), math.log(0.5), math.log(0.5)])  # ratios 1, 0.5, 1.6
ADV = torch.tensor([1.0, -1.0, 2.0])


def _loss(name: str, config: dict | None = None, **x: torch.Tensor) -> float:
    return float(losses.datum_loss(name, LP, x, losses.resolve_config(name, config)))


def test_cross_entropy_is_the_weighted_sum_of_negative_logprobs() -> None:
    w = torch.tensor([1.0, 0.0, 2.0])
    assert _loss("cross_entropy", weights=w) == pytest.approx(-(math.log(0.5) + 2 * math.log(0.8)))


def test_importance_sampling_weighs_advantages_by_the_ratio() -> None:
    # -(1*1 + 0.5*(-1) + 1.6*2) = -3.7
    assert _loss("importance_sampling", logprobs=Q, advantages=ADV) == pytest.approx(-3.7)


def test_ppo_takes_the_pessimistic_of_clipped_and_unclipped() -> None:
    # ratio 1: 1; ratio 0.5 clipped to 0.8, A=-1: min(-0.5, -0.8) = -0.8; ratio 1.6 clipped to 1.2, A=2: min(3.2, 2.4)
    assert _loss("ppo", logprobs=Q, advantages=ADV) == pytest.approx(-(1 - 0.8 + 2.4))
    # wider bounds: ratio 0.5 clipped to 0.4 -> min(-0.5, -0.4) = -0.5; 1.6 within 2.0
    assert _loss("ppo", {"clip_low_threshold": 0.4, "clip_high_threshold": 2.0}, logprobs=Q,
                 advantages=ADV) == pytest.approx(-(1 - 0.5 + 3.2))


def test_cispo_weighs_logprobs_by_the_clipped_ratio_without_its_gradient() -> None:
    want = -(1 * LP[0] * 1 + 0.8 * LP[1] * -1 + 1.2 * LP[2] * 2)
    assert _loss("cispo", logprobs=Q, advantages=ADV) == pytest.approx(float(want))
    lp = LP.clone().requires_grad_(True)
    losses.datum_loss("cispo", lp, {"logprobs": Q, "advantages": ADV}, losses.resolve_config("cispo", None)).backward()
    assert lp.grad is not None
    assert lp.grad.tolist() == pytest.approx([-1.0, 0.8, -2.4])  # the ratio is a constant


def test_dro_penalises_the_squared_log_ratio() -> None:
    d = LP - Q
    want = -(LP * ADV - 0.5 * 0.05 * d ** 2).sum()
    assert _loss("dro", logprobs=Q, advantages=ADV) == pytest.approx(float(want))
    want = -(LP * ADV - 0.5 * 1.0 * d ** 2).sum()
    assert _loss("dro", {"beta": 1.0}, logprobs=Q, advantages=ADV) == pytest.approx(float(want))


def test_unknown_losses_keys_and_missing_inputs_are_refused() -> None:
    with pytest.raises(TinkerUserError, match="client-side"):
        losses.resolve_config("custom", None)
    with pytest.raises(TinkerUserError, match="'gspo' is not served"):
        losses.resolve_config("gspo", None)
    with pytest.raises(TinkerUserError, match="ppo takes clip_high_threshold, clip_low_threshold"):
        losses.resolve_config("ppo", {"beta": 0.1})
    with pytest.raises(TinkerUserError, match="needs loss_fn_inputs\\['advantages'\\]"):
        losses.check_inputs("dro", 0, 3, {"target_tokens": torch.zeros(3), "logprobs": Q})
    with pytest.raises(TinkerUserError, match="has shape \\[2\\], the model input 3 tokens"):
        losses.check_inputs("cross_entropy", 0, 3, {"target_tokens": torch.zeros(3), "weights": torch.ones(2)})
