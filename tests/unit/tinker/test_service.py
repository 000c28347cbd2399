"""The service's sessions and models over a stand-in trainer: ids as the SDK derives them, an owner sees only
its own, a finished or expired session frees its adapters, bad shapes are refused before any work."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agentrl.tinker.checkpoints import Checkpoints
from agentrl.tinker.errors import TinkerGone, TinkerNotFound, TinkerUserError
from agentrl.tinker.service import TinkerService
from agentrl.tinker.trainer import LoraTrainer


class FakeTrainer:
    """The trainer's bookkeeping without a model: its own shape check, adapters by name."""

    max_rank = 16
    base = SimpleNamespace(config=SimpleNamespace(model_type="qwen2"))
    check = LoraTrainer.check

    def __init__(self) -> None:
        self.adapters: dict[str, Any] = {}

    def add(self, name: str, spec: Any) -> None:
        self.adapters[name] = spec

    def remove(self, name: str) -> None:
        self.adapters.pop(name, None)


def _create(rank: int = 8, session: str = "", seq: int = 0, base: str = "tiny") -> Any:
    lora = SimpleNamespace(rank=rank, seed=None, train_mlp=True, train_attn=True, train_unembed=True)
    return SimpleNamespace(session_id=session, model_seq_id=seq, base_model=base, lora_config=lora,
                           optimizer_config=SimpleNamespace(type="adamw"))


@pytest.fixture
def svc(tmp_path: Path) -> TinkerService:
    return TinkerService(FakeTrainer(), Checkpoints(tmp_path), model_name="tiny", model_dir=tmp_path,  # type: ignore[arg-type]
                         max_context=512)


async def test_models_are_created_under_the_sdks_ids_and_seen_by_their_owner_only(svc: TinkerService) -> None:
    sid = svc.create_session("alice")
    fut = svc.create_model("alice", _create(session=sid, seq=0))
    await asyncio.wait_for(fut.done.wait(), 5)
    assert fut.json == {"model_id": f"{sid}:train:0", "type": "create_model"}
    assert svc.create_model("alice", _create(session=sid, seq=0)) is fut  # a retry
    assert svc.get_info("alice", f"{sid}:train:0")["lora_rank"] == 8
    with pytest.raises(TinkerNotFound):
        svc.get_info("bob", f"{sid}:train:0")
    with pytest.raises(TinkerNotFound):
        svc.create_model("bob", _create(session=sid, seq=1))  # not bob's session


async def test_bad_shapes_are_refused_at_once(svc: TinkerService) -> None:
    sid = svc.create_session("alice")
    with pytest.raises(TinkerUserError, match="LoRA rank 32: this server holds ranks 1 to 16"):
        svc.create_model("alice", _create(rank=32, session=sid))
    with pytest.raises(TinkerUserError, match="serves 'tiny' only"):
        svc.create_model("alice", _create(session=sid, base="Qwen/Qwen3-8B"))


async def test_a_finished_or_silent_session_frees_its_adapters(svc: TinkerService) -> None:
    trainer: FakeTrainer = svc.trainer  # type: ignore[assignment]
    done, silent, alive = (svc.create_session("alice") for _ in range(3))
    for sid in (done, silent, alive):
        await asyncio.wait_for(svc.create_model("alice", _create(session=sid)).done.wait(), 5)
    assert len(trainer.adapters) == 3
    await svc.finish("alice", done, "success")
    with pytest.raises(TinkerGone):
        svc.heartbeat("alice", done)
    svc.sessions[silent].last_heartbeat = time.monotonic() - 700
    assert await svc.expire(600) == [silent]
    assert len(trainer.adapters) == 1 and list(svc.models) == [f"{alive}:train:0"]
    assert svc.sessions[silent].finished == "expired"


async def test_a_datum_longer_than_the_context_is_refused_at_once(svc: TinkerService) -> None:
    tinker = pytest.importorskip("tinker")
    from tinker.proto.request_conv import forward_backward_request_to_proto

    datum = tinker.types.Datum(model_input=tinker.types.ModelInput.from_ints(list(range(600))),
                               loss_fn_inputs={"target_tokens": list(range(600)), "weights": [1.0] * 600})
    req = tinker.types.ForwardBackwardRequest(model_id="s:train:0", seq_id=1, forward_backward_input=(
        tinker.types.ForwardBackwardInput(data=[datum], loss_fn="cross_entropy")))
    with pytest.raises(TinkerUserError, match="a datum of 600 tokens; this server's context is 512"):
        svc.forward_backward("alice", forward_backward_request_to_proto(req).SerializeToString())
