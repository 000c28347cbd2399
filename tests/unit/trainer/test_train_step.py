"""The trainer's step in-process (FSDP2 over a one-rank gloo world, a random tiny model): staleness is
measured against the policy version the request names, whatever the number of optimizer steps per
request, and ``score`` returns the logprobs the loss uses, at each sample's temperature."""

from __future__ import annotations

from pathlib import Path

import torch

from agentrl.config.trainer import TrainerConfig
from agentrl.core.types import TrainSample


def make_step(model_dir: Path, **kw: object):
    from torch.distributed.device_mesh import init_device_mesh

    from agentrl.trainer import model as model_io
    from agentrl.trainer.train_step import TrainStep

    cfg = TrainerConfig(model_path=str(model_dir), lora_rank=4, lr=1e-3, **kw)
    model = model_io.build_model(cfg, init_device_mesh("cpu", (1,)), torch.device("cpu"))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    return TrainStep(model, opt, cfg, torch.device("cpu"))


def samples(version: int, n: int = 4, temperature: float = 1.0) -> list[TrainSample]:
    out = []
    for i in range(n):
        ids = [5 + (i * 7 + j * 3) % 300 for j in range(12)]
        out.append(TrainSample(input_ids=ids, loss_mask=[0] * 4 + [1] * 8, behav_logprobs=[0.0] * 4 + [-3.0] * 8,
                               advantage=1.0 if i % 2 else -1.0, versions=[-1] * 4 + [version] * 8,
                               temperature=temperature))
    return out


def test_staleness_is_against_the_requested_policy_version(world: None, tiny_tokenizer_model: Path) -> None:
    """With 2 epochs x 2 minibatches (4 optimizer steps per request) the second request trains policy 1 on
    tokens of policy 1 (staleness 0) and policy 0 (staleness 1), not "optimizer step 4 minus 1"."""
    step = make_step(tiny_tokenizer_model, ppo_epochs=2, num_minibatches=2)
    first = step.train(samples(version=0), policy_version=0)
    assert (first["staleness_mean"], first["optimizer_step"], first["num_steps"]) == (0.0, 4, 4)
    second = step.train(samples(version=1, n=2) + samples(version=0, n=2), policy_version=1)
    assert (second["staleness_mean"], second["staleness_max"]) == (0.5, 1.0)
    assert (second["optimizer_step"], second["policy_version"]) == (8, 1)


def test_score_is_the_losss_logprob_at_each_temperature(world: None, tiny_tokenizer_model: Path) -> None:
    step = make_step(tiny_tokenizer_model)
    hot, cold = samples(0, n=1, temperature=1.0)[0], samples(0, n=1, temperature=0.5)[0]
    long = TrainSample(input_ids=[7] * 30, loss_mask=[0] + [1] * 29, behav_logprobs=[0.0] * 30, advantage=1.0,
                       versions=[-1] + [0] * 29)
    got = step.score([hot, long, cold])
    assert [len(g) for g in got] == [12, 30, 12] and got[0][0] == 0.0
    batch = step._batch([hot, cold])
    ref, mask = step._logprobs(batch), batch["loss_mask_B_T"]  # the loss scores its own tokens only
    assert torch.equal(ref * (1 - mask), torch.zeros_like(ref)) and mask.sum() > 0
    assert torch.allclose(torch.tensor(got[0]) * mask[0, :12], ref[0, :12], atol=1e-5)
    assert torch.allclose(torch.tensor(got[2]) * mask[1, :12], ref[1, :12], atol=1e-5)
    assert not torch.allclose(torch.tensor(got[0][1:]), torch.tensor(got[2][1:]), atol=1e-3)


def test_frozen_parameters_stay_put_and_the_rest_trains(world: None, tiny_tokenizer_model: Path) -> None:
    """Full weights with the embedding and the norms frozen: a step moves every other weight and none of
    those; a name that matches nothing, or freezing under LoRA, is refused."""
    import pytest

    step = make_step(tiny_tokenizer_model, lora=False, frozen_parameters=["embed_tokens", "norm"])
    named = dict(step.model.named_parameters())
    frozen = {n for n, p in named.items() if not p.requires_grad}
    assert frozen and all("embed_tokens" in n or "norm" in n for n in frozen)
    assert any("layernorm" in n for n in frozen) and any("embed_tokens" in n for n in frozen)
    before = {n: p.detach().full_tensor().clone() for n, p in named.items()}
    step.train(samples(version=0), policy_version=0)
    for n, p in named.items():
        moved = not torch.equal(before[n], p.detach().full_tensor())
        assert moved == (n not in frozen), n
    with pytest.raises(ValueError, match="name no parameter"):
        make_step(tiny_tokenizer_model, lora=False, frozen_parameters=["no_such_weight"])
    with pytest.raises(ValueError, match="full-weight training"):
        TrainerConfig(model_path="m", frozen_parameters=["norm"])
