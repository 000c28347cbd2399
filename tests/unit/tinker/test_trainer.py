"""The trainer's adapters on a small random model: each adapter trains alone, its AdamW state is its own, a
saved state loads back exactly (the next step included)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agentrl.tinker.errors import TinkerUserError
from agentrl.tinker.trainer import LoraSpec, LoraTrainer, read_spec
from agentrl.tinker.wire import WireDatum

ADAM = {"learning_rate": 1e-2}


def _data() -> list[WireDatum]:
    toks = np.arange(3, 15, dtype=np.int64)
    return [WireDatum(toks[:-1], {"target_tokens": toks[1:], "weights": np.ones(11, dtype=np.float32)}),
            WireDatum(toks[:5], {"target_tokens": toks[1:6], "weights": np.ones(5, dtype=np.float32)})]


def _loss(t: LoraTrainer, name: str, forward_only: bool = True) -> float:
    return t.forward_backward(name, _data(), "cross_entropy", {}, forward_only)[1]["loss:sum"]


@pytest.fixture(scope="module")
def trainer(tiny_tokenizer_model: Path) -> LoraTrainer:
    return LoraTrainer(tiny_tokenizer_model, max_rank=16)


def test_adapters_train_alone_from_the_base_model(trainer: LoraTrainer) -> None:
    trainer.add("x1", LoraSpec(rank=4, seed=0))
    trainer.add("x2", LoraSpec(rank=4, seed=0, train_mlp=False))
    start = _loss(trainer, "x1")
    assert _loss(trainer, "x2") == pytest.approx(start, rel=1e-6)  # B = 0: both are the base model
    outs, metrics = trainer.forward_backward("x1", _data(), "cross_entropy", {}, False)
    assert [o["logprobs"].shape for o in outs] == [(11,), (5,)]
    assert metrics["loss:sum"] == pytest.approx(-sum(float(o["logprobs"].sum()) for o in outs), rel=1e-5)
    trainer.optim_step("x1", ADAM)
    assert _loss(trainer, "x1") < start
    assert _loss(trainer, "x2") == pytest.approx(start, rel=1e-6)  # untouched
    assert trainer.tensors("x2").keys() and all("mlp" not in k for k in trainer.tensors("x2"))
    trainer.remove("x1")
    trainer.remove("x2")


def test_a_saved_state_loads_back_exactly(trainer: LoraTrainer, tmp_path: Path) -> None:
    trainer.add("x3", LoraSpec(rank=8, seed=3))
    for _ in range(2):
        trainer.forward_backward("x3", _data(), "cross_entropy", {}, False)
        trainer.optim_step("x3", ADAM)
    trainer.save("x3", tmp_path / "ck", optimizer=True)
    trainer.forward_backward("x3", _data(), "cross_entropy", {}, False)
    trainer.optim_step("x3", ADAM)
    after = _loss(trainer, "x3")
    spec = read_spec(tmp_path / "ck")
    assert spec == LoraSpec(rank=8, seed=3)
    trainer.add("x4", spec)
    trainer.load("x4", tmp_path / "ck", optimizer=True)
    trainer.forward_backward("x4", _data(), "cross_entropy", {}, False)
    trainer.optim_step("x4", ADAM)
    assert _loss(trainer, "x4") == after  # same weights, same Adam moments: the same step
    trainer.remove("x3")
    trainer.remove("x4")


def test_shapes_the_server_cannot_serve_are_refused(trainer: LoraTrainer) -> None:
    with pytest.raises(TinkerUserError, match="LoRA rank 32: this server holds ranks 1 to 16"):
        trainer.add("x5", LoraSpec(rank=32))
    with pytest.raises(TinkerUserError, match="train_attn, train_mlp and train_unembed are all off"):
        trainer.add("x5", LoraSpec(rank=4, train_attn=False, train_mlp=False, train_unembed=False))
    trainer.add("x6", LoraSpec(rank=4, train_attn=False, train_mlp=False))  # the output layer alone
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainer.tensors("x6")} == {"lm_head"}
    trainer.remove("x6")
    trainer.add("x5", LoraSpec(rank=4))
    bad = [WireDatum(np.array([1, 2]), {"target_tokens": np.array([2, 10**6]), "weights": np.ones(2, np.float32)})]
    with pytest.raises(TinkerUserError, match="outside the model's vocabulary"):
        trainer.forward_backward("x5", bad, "cross_entropy", {}, True)
    trainer.remove("x5")
