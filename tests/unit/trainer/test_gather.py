"""``gather_trainable`` on one rank: after its first call (a state dict, peft's renaming) later calls copy the
parameters they found straight from the model; what they return must be what the state-dict path returns, after
the parameters have trained, with and without the embedding trained whole, and must not alias the live tensors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrl.trainer import model as model_io
from tests.unit.trainer.test_train_step import make_step, samples


@pytest.mark.parametrize("embedding", [False, True], ids=["adapter", "adapter and embedding"])
def test_planned_gather_is_the_state_dict_gather(world: None, tiny_tokenizer_model: Path, embedding: bool) -> None:
    step = make_step(tiny_tokenizer_model, lora_train_embedding=embedding)
    model, cfg = step.model, step.cfg
    first = {k: v.clone() for k, v in model_io.gather_trainable(model, cfg).items()}  # on the CPU: live views
    assert getattr(model, model_io.GATHER_PLAN) is not None
    assert any(k.endswith("embed_tokens.weight") for k in first) == embedding
    step.train(samples(0), 0)  # the parameters move
    planned = model_io.gather_trainable(model, cfg)
    delattr(model, model_io.GATHER_PLAN)
    built = model_io.gather_trainable(model, cfg)  # the state-dict path again
    assert list(planned) == list(built) == list(first)
    assert all(torch.equal(planned[k], built[k]) for k in built)
    assert any(not torch.equal(planned[k], first[k]) for k in built)  # trained: not the first call's values
    before = {k: v.clone() for k, v in planned.items()}
    step.train(samples(0), 0)
    assert all(torch.equal(planned[k], before[k]) for k in before)  # copies, not views of the live parameters
