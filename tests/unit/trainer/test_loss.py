"""The policy loss, advantages and token logprobs against deliberately plain reference implementations."""

from __future__ import annotations

import math

import pydantic
import pytest
import torch

from agentrl.config.trainer import LossConfig
from agentrl.trainer.loss import policy_loss, token_logprobs


def reference_loss(logp, behav, adv, mask, cfg, prox=None, ref=None, n_tok=None, n_seq=None):
    """Token-by-token Python loops over scalar tensors: the loss definition, written out."""
    total = logp.new_zeros(())
    seq_means = []
    count = 0
    for b in range(logp.shape[0]):
        seq_sum = logp.new_zeros(())
        seq_n = 0
        # Sequence level: the mean log-ratio of the loss tokens, a constant; each token's ratio is
        # exp(that + lp - sg[lp]), valued s with gradient s * grad lp.
        base = [float(behav[b, t]) if cfg.is_correction == "none" else
                float(logp[b, t].detach()) if prox is None else float(prox[b, t])
                for t in range(logp.shape[1]) if mask[b][t] != 0]
        lps = [float(logp[b, t].detach()) for t in range(logp.shape[1]) if mask[b][t] != 0]
        seq_log_ratio = sum(lp - p for lp, p in zip(lps, base, strict=True)) / max(len(lps), 1)
        for t in range(logp.shape[1]):
            if mask[b][t] == 0:
                continue
            lp = logp[b, t]
            a = float(adv[b])
            if a < 0:
                a *= cfg.negative_weight
            if cfg.is_correction == "none":
                ratio = torch.exp(lp - float(behav[b, t]))
                w = 1.0
            else:
                p = float(lp.detach()) if prox is None else float(prox[b, t])
                ratio = torch.exp(lp - p)
                w = math.exp(p - float(behav[b, t]))
                if cfg.is_correction == "tis":
                    w = min(w, cfg.tis_cap)
                elif w > cfg.tis_cap:
                    w = 0.0
            if cfg.ratio_level == "sequence":
                ratio = torch.exp(lp - float(lp.detach()) + seq_log_ratio)
            lo, hi = 1.0 - cfg.clip_low, 1.0 + cfg.clip_high
            clipped = torch.clamp(ratio, lo, hi)
            term = torch.maximum(-ratio * a, -clipped * a) * w
            if cfg.kl_coef > 0 and ref is not None:
                d = float(ref[b, t]) - lp
                term = term + cfg.kl_coef * (torch.exp(d) - d - 1.0)
            seq_sum = seq_sum + term
            seq_n += 1
        total = total + seq_sum
        count += seq_n
        if seq_n:
            seq_means.append(seq_sum / seq_n)
    if cfg.aggregation == "token_mean":
        return total / (count if n_tok is None else n_tok)
    return sum(seq_means) / (len(seq_means) if n_seq is None else n_seq)


def make_batch(seed: int = 0, B: int = 5, T: int = 9):
    """Random off-policy batch whose ratios hit both clip bounds and whose weights exceed the cap."""
    g = torch.Generator().manual_seed(seed)
    behav = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4 - 0.1
    prox = behav + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.8
    logp = prox + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.4
    ref = logp + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) < 0.7).to(torch.float64)
    mask[:, 0] = 0
    mask[1] = 0  # a sequence with no loss tokens
    mask[2, 1] = 1
    # Garbage on masked-out positions (would overflow exp) must not leak into the loss or gradients.
    keep = mask.bool()
    logp = torch.where(keep, logp, torch.full_like(logp, 1000.0))
    behav = torch.where(keep, behav, torch.zeros_like(behav))
    prox = torch.where(keep, prox, torch.full_like(prox, 1000.0))
    ref = torch.where(keep, ref, torch.full_like(ref, -1000.0))
    return logp, behav, adv, mask, prox, ref


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
@pytest.mark.parametrize("correction", ["none", "tis", "decoupled"])
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_loss_and_grad_match_reference(correction: str, aggregation: str, kl_coef: float, ratio_level: str) -> None:
    cfg = LossConfig(
        is_correction=correction, aggregation=aggregation, kl_coef=kl_coef, tis_cap=1.5, ratio_level=ratio_level,
        # Sequence ratios (geometric means) stay nearer 1: tighter clips so the batch still clips some.
        clip_low=0.2 if ratio_level == "token" else 0.05, clip_high=0.28 if ratio_level == "token" else 0.05,
    )
    logp, behav, adv, mask, prox, ref = make_batch()
    x = logp.clone().requires_grad_(True)
    loss, metrics = policy_loss(x, behav, adv, mask, cfg, prox_logprobs_B_T=prox, ref_logprobs_B_T=ref)
    loss.backward()
    y = logp.clone().requires_grad_(True)
    expected = reference_loss(y, behav, adv, mask, cfg, prox=prox, ref=ref)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-9, abs=1e-12)
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-9, atol=1e-12)
    assert torch.isfinite(x.grad).all()
    assert metrics["clip_frac"] > 0, "the batch must exercise the clip"
    if correction != "none":
        assert metrics["is_capped_frac"] > 0, "the batch must exercise the cap"
    assert (metrics["kl"] > 0) == (kl_coef > 0)


def _grad_matching_reference(logp, behav, adv, mask, cfg):
    """``logp`` as a leaf after backward through :func:`policy_loss` (no proximal logprobs), once its loss and
    gradient are checked against :func:`reference_loss`."""
    x = logp.clone().requires_grad_(True)
    loss, _ = policy_loss(x, behav, adv, mask, cfg)
    loss.backward()
    y = logp.clone().requires_grad_(True)
    expected = reference_loss(y, behav, adv, mask, cfg)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-9)
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-9, atol=1e-12)
    return x


@pytest.mark.parametrize("correction", ["tis", "decoupled"])
def test_missing_prox_means_current_policy(correction: str) -> None:
    cfg = LossConfig(is_correction=correction)
    logp, behav, adv, mask, _, _ = make_batch(seed=1)
    _grad_matching_reference(logp, behav, adv, mask, cfg)


@pytest.mark.parametrize("weight", [0.0, 0.25])
def test_negative_weight_scales_only_the_negative_advantages(weight: float) -> None:
    cfg = LossConfig(negative_weight=weight)
    logp, behav, adv, mask, _, _ = make_batch(seed=4)
    assert (adv < 0).any() and (adv > 0).any()
    x = _grad_matching_reference(logp, behav, adv, mask, cfg)
    # the same as symmetric GRPO on advantages scaled by hand
    scaled = torch.where(adv < 0, adv * weight, adv)
    z = logp.clone().requires_grad_(True)
    plain, _ = policy_loss(z, behav, scaled, mask, LossConfig())
    plain.backward()
    torch.testing.assert_close(x.grad, z.grad)
    # each term is linear in a positive multiple of its advantage: the negative rows shrink by the weight
    neg = adv < 0
    symmetric = logp.clone().requires_grad_(True)
    policy_loss(symmetric, behav, adv, mask, LossConfig())[0].backward()
    torch.testing.assert_close(x.grad[neg], symmetric.grad[neg] * weight)
    torch.testing.assert_close(x.grad[~neg], symmetric.grad[~neg])


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
@pytest.mark.parametrize("correction", ["none", "tis", "decoupled"])
def test_on_policy_ratios_and_weights_are_exactly_one(correction: str, ratio_level: str) -> None:
    cfg = LossConfig(is_correction=correction, ratio_level=ratio_level)
    logp, _, adv, mask, _, _ = make_batch(seed=2)
    logp = logp.float()
    x = logp.clone().requires_grad_(True)
    loss, metrics = policy_loss(x, logp.clone(), adv.float(), mask, cfg, prox_logprobs_B_T=logp.clone())
    loss.backward()
    assert metrics["ratio_mean"] == 1.0
    assert metrics["is_weight_mean"] == 1.0
    assert metrics["clip_frac"] == 0.0
    n = mask.sum()
    expected_grad = (-adv.float()[:, None] * mask / n).float()
    torch.testing.assert_close(x.grad, expected_grad, rtol=1e-6, atol=1e-9)
    assert loss.item() == pytest.approx(float(-(adv[:, None] * mask).sum() / n), rel=1e-6)


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
def test_global_normaliser_makes_shard_losses_add_up(aggregation: str, ratio_level: str) -> None:
    cfg = LossConfig(aggregation=aggregation, kl_coef=0.05, ratio_level=ratio_level)
    logp, behav, adv, mask, prox, ref = make_batch(seed=3, B=6)
    full, _ = policy_loss(logp, behav, adv, mask, cfg, prox, ref)
    n_tok = float(mask.sum())
    n_seq = float((mask.sum(-1) > 0).sum())
    parts = []
    for sl in (slice(0, 2), slice(2, 6)):
        part, m = policy_loss(
            logp[sl],
            behav[sl],
            adv[sl],
            mask[sl],
            cfg,
            prox[sl],
            ref[sl],
            num_tokens_global=n_tok,
            num_seqs_global=n_seq,
        )
        parts.append(part)
        assert m["num_tokens"] == float(mask[sl].sum())
    assert sum(parts).item() == pytest.approx(full.item(), rel=1e-12)
    assert parts[0].item() != pytest.approx(full.item())


def test_tis_truncates_and_decoupled_drops() -> None:
    logp = torch.tensor([[0.0, -1.0, -1.0]])
    behav = torch.tensor([[0.0, -3.0, -1.2]])  # weights: 1, e^2 (over the cap), e^0.2
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    adv = torch.tensor([1.0])
    tis, mt = policy_loss(logp, behav, adv, mask, LossConfig(is_correction="tis", tis_cap=2.0))
    dec, md = policy_loss(logp, behav, adv, mask, LossConfig(is_correction="decoupled", tis_cap=2.0))
    assert tis.item() == pytest.approx(-(2.0 + math.exp(0.2)) / 2, rel=1e-6)
    assert dec.item() == pytest.approx(-math.exp(0.2) / 2, rel=1e-6)
    assert mt["is_capped_frac"] == md["is_capped_frac"] == 0.5


def test_config_bounds() -> None:
    with pytest.raises(pydantic.ValidationError):
        LossConfig(clip_low=-0.1)
    with pytest.raises(pydantic.ValidationError):
        LossConfig(tis_cap=0.5)
    with pytest.raises(pydantic.ValidationError):
        LossConfig(aggregation="sum")
    with pytest.raises(pydantic.ValidationError):
        LossConfig(ratio_level="seq")
    assert LossConfig().ratio_level == "token"


@pytest.mark.parametrize("correction", ["none", "tis", "decoupled"])
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
def test_sequence_ratio_with_one_loss_token_per_sequence_is_the_token_ratio(correction: str, aggregation: str) -> None:
    logp, behav, adv, mask, prox, ref = make_batch(seed=5, B=6)
    one = torch.zeros_like(mask)
    for b, t in [(0, 3), (2, 1), (3, 8), (4, 2), (5, 5)]:  # row 1 keeps no loss token
        one[b, t] = 1.0
    logp = torch.where(one.bool(), torch.where(mask.bool(), logp, behav - 0.3), logp)
    prox = torch.where(one.bool(), torch.where(mask.bool(), prox, behav + 0.9), prox)
    out = {}
    for level in ("token", "sequence"):
        cfg = LossConfig(is_correction=correction, aggregation=aggregation, ratio_level=level, kl_coef=0.1,
                         tis_cap=1.5, clip_low=0.1, clip_high=0.1)
        x = logp.clone().requires_grad_(True)
        loss, m = policy_loss(x, behav, adv, one, cfg, prox_logprobs_B_T=prox, ref_logprobs_B_T=ref)
        loss.backward()
        out[level] = (loss, x.grad, m)
    assert out["token"][0].item() == pytest.approx(out["sequence"][0].item(), rel=1e-12)
    torch.testing.assert_close(out["token"][1], out["sequence"][1], rtol=1e-12, atol=1e-15)
    assert out["token"][2] == pytest.approx(out["sequence"][2], rel=1e-12)
    assert out["token"][2]["clip_frac"] > 0


@pytest.mark.parametrize("correction", ["none", "tis"])
def test_identical_token_log_ratios_give_that_ratio(correction: str) -> None:
    """A sequence whose tokens all have log-ratio c has ratio exp(c); with every sequence so, the
    sequence loss is the token loss, gradients included."""
    logp, behav, adv, mask, prox, _ = make_batch(seed=6)
    c_B = torch.tensor([0.1, 0.0, -0.15, 0.05, 0.3], dtype=torch.float64)
    base = behav if correction == "none" else prox
    logp = torch.where(mask.bool(), base + c_B[:, None], logp)
    out = {}
    for level in ("token", "sequence"):
        cfg = LossConfig(is_correction=correction, ratio_level=level, clip_low=0.12, clip_high=0.2)
        x = logp.clone().requires_grad_(True)
        loss, m = policy_loss(x, behav, adv, mask, cfg, prox_logprobs_B_T=prox)
        loss.backward()
        out[level] = (loss, x.grad, m)
    tokens_B = mask.sum(-1)
    expected_ratio_mean = float((c_B.exp() * tokens_B).sum() / tokens_B.sum())
    assert out["sequence"][2]["ratio_mean"] == pytest.approx(expected_ratio_mean, rel=1e-6)  # float32 metrics
    assert out["token"][0].item() == pytest.approx(out["sequence"][0].item(), rel=1e-12)
    torch.testing.assert_close(out["token"][1], out["sequence"][1], rtol=1e-12, atol=1e-15)
    assert out["token"][2] == pytest.approx(out["sequence"][2], rel=1e-6)
    assert 0 < out["sequence"][2]["clip_frac"] < 1


def test_sequence_clip_keeps_or_cuts_whole_sequences() -> None:
    """Token ratios (e^0.3, 1, 1, 1) and (1.02, 1.02, 1.5), clip 1.1: token level clips one token of each;
    sequence level keeps all of the first (geometric mean e^0.075 ~ 1.08) and cuts all of the second
    (geometric mean ~1.16 > 1.1), even its tokens whose own ratio is inside the clip."""
    behav = torch.full((2, 5), -1.0, dtype=torch.float64)
    logp = behav.clone()
    logp[0, 1] += 0.3
    logp[1, 1:4] += torch.tensor([math.log(1.02), math.log(1.02), math.log(1.5)], dtype=torch.float64)
    mask = torch.tensor([[0, 1, 1, 1, 1], [0, 1, 1, 1, 0]], dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0], dtype=torch.float64)
    seq_ratio = [math.exp(0.3 / 4), math.exp((2 * math.log(1.02) + math.log(1.5)) / 3)]
    kept = mask.clone()
    kept[1] = 0

    cfg = LossConfig(is_correction="none", ratio_level="sequence", aggregation="seq_mean", clip_low=0.1,
                     clip_high=0.1)
    x = logp.clone().requires_grad_(True)
    loss, m = policy_loss(x, behav, adv, mask, cfg)
    loss.backward()
    assert m["clip_frac"] == pytest.approx(3 / 7)
    assert m["ratio_mean"] == pytest.approx((4 * seq_ratio[0] + 3 * seq_ratio[1]) / 7, rel=1e-6)
    assert loss.item() == pytest.approx(-(seq_ratio[0] + 1.1) / 2, rel=1e-12)
    # Kept sequence: every token gets s * A / |y| / n_seqs; the clipped one gets nothing.
    torch.testing.assert_close(x.grad, -kept * seq_ratio[0] / 4 / 2, rtol=1e-12, atol=0.0)

    _, mt = policy_loss(logp, behav, adv, mask, cfg.model_copy(update={"ratio_level": "token"}))
    assert mt["clip_frac"] == pytest.approx(2 / 7)


@pytest.mark.parametrize("correction", ["none", "tis", "decoupled"])
@pytest.mark.parametrize("aggregation", ["seq_mean", "token_mean"])
def test_sequence_gradient_is_gspo(correction: str, aggregation: str) -> None:
    """Against autograd of GSPO's objective written directly, s_i = exp(mean_t(logp - old)) with no
    stop-gradient: mean_i min(s_i A_i, clip(s_i) A_i) (seq_mean), or each sequence weighted by its loss
    tokens (token_mean). With a behaviour weight, token t's gradient is GSPO's times its own w_t."""
    logp, behav, adv, mask, prox, _ = make_batch(seed=7, B=6)
    cfg = LossConfig(is_correction=correction, aggregation=aggregation, ratio_level="sequence", tis_cap=1.5,
                     clip_low=0.04, clip_high=0.05)
    x = logp.clone().requires_grad_(True)
    loss, m = policy_loss(x, behav, adv, mask, cfg, prox_logprobs_B_T=prox)
    loss.backward()

    old = behav if correction == "none" else prox
    y = logp.clone().requires_grad_(True)
    tokens_B = mask.sum(-1)
    keep = mask.bool()
    log_s_B = torch.where(keep, y - old, torch.zeros_like(y)).sum(-1) / tokens_B.clamp(min=1)
    s_B = torch.exp(log_s_B)
    obj_B = torch.minimum(s_B * adv, torch.clamp(s_B, 1 - cfg.clip_low, 1 + cfg.clip_high) * adv)
    n_seq = float((tokens_B > 0).sum())
    if aggregation == "seq_mean":
        gspo = -(obj_B * (tokens_B > 0)).sum() / n_seq
    else:
        gspo = -(obj_B * tokens_B).sum() / tokens_B.sum()
    gspo.backward()
    clipped_B = (s_B * adv).detach() > (torch.clamp(s_B, 1 - cfg.clip_low, 1 + cfg.clip_high) * adv).detach()
    assert 0 < float(clipped_B.sum()) < float((tokens_B > 0).sum()), "the batch must clip some sequences"
    if correction == "none":
        assert loss.item() == pytest.approx(gspo.item(), rel=1e-12)
        torch.testing.assert_close(x.grad, y.grad, rtol=1e-10, atol=1e-14)
    else:
        w = torch.where(keep, torch.exp(prox - behav), torch.zeros_like(prox))
        w = torch.clamp(w, max=1.5) if correction == "tis" else torch.where(w > 1.5, 0.0, w)
        assert float(((w > 0) & (w < 1.5) & keep).sum()) > 0 and m["is_capped_frac"] > 0
        torch.testing.assert_close(x.grad, y.grad * w, rtol=1e-10, atol=1e-14)


def test_token_logprobs_matches_log_softmax_loop() -> None:
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(3, 7, 11, generator=g, dtype=torch.float64) * 3
    ids = torch.randint(0, 11, (3, 7), generator=g)
    x = logits.clone().requires_grad_(True)
    out = token_logprobs(x, ids)
    assert out.shape == (3, 7)
    expected = torch.zeros(3, 7, dtype=torch.float64)
    y = logits.clone().requires_grad_(True)
    for b in range(3):
        for t in range(1, 7):
            expected[b, t] = torch.log_softmax(y[b, t - 1], dim=-1)[ids[b, t]]
    assert (out[:, 0] == 0).all()
    torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=1e-6)
    weights = torch.randn(3, 7, generator=g, dtype=torch.float64)
    (out.double() * weights).sum().backward()
    (expected * weights).sum().backward()
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-5, atol=1e-6)


def test_token_logprobs_bfloat16_is_computed_in_float32() -> None:
    logits = torch.randn(2, 5, 300).to(torch.bfloat16)
    ids = torch.randint(0, 300, (2, 5))
    out = token_logprobs(logits, ids)
    assert out.dtype == torch.float32
    expected = torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(out[:, 1:], expected, rtol=1e-6, atol=1e-5)


def test_token_logprobs_at_the_sampling_temperature() -> None:
    """Each sequence is scored under softmax(logits / T) with its own T; T = 1 is the plain log-softmax."""
    torch.manual_seed(0)
    logits_B_T_V = torch.randn(2, 5, 11)
    ids_B_T = torch.randint(0, 11, (2, 5))
    temps_B = torch.tensor([0.7, 1.0])
    got_B_T = token_logprobs(logits_B_T_V, ids_B_T, temps_B)
    for b, t in enumerate(temps_B.tolist()):
        ref_T = torch.log_softmax(logits_B_T_V[b, :-1] / t, dim=-1).gather(-1, ids_B_T[b, 1:, None])[:, 0]
        assert torch.allclose(got_B_T[b, 1:], ref_T, atol=1e-6)
    assert torch.allclose(got_B_T[1], token_logprobs(logits_B_T_V, ids_B_T)[1])
    assert not torch.allclose(got_B_T[0], token_logprobs(logits_B_T_V, ids_B_T)[0], atol=1e-3)
