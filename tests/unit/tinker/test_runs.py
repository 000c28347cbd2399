"""Training runs and their checkpoints as the SDK's REST client lists them: ``run.json`` written when a model is
made and read by a server started later, the SDK's ``TrainingRun``/``Checkpoint`` shapes, pages, deletion, and
an owner that sees only its own."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from agentrl.tinker.checkpoints import Checkpoint, Checkpoints
from agentrl.tinker.errors import TinkerNotFound, TinkerUserError
from agentrl.tinker.runs import Runs, string_metadata
from agentrl.tinker.service import TinkerService
from agentrl.tinker.trainer import LoraSpec
from tests.unit.tinker.test_service import FakeTrainer


def _save(cps: Checkpoints, owner: str, model_id: str, kind: str, name: str, rank: int = 8,
          created: float | None = None, user_metadata: dict[str, Any] | None = None) -> Checkpoint:
    """A checkpoint as the trainer leaves it: files, its lora_spec.json, then meta.json."""
    ckpt = cps.new(owner, model_id, kind, name)
    ckpt.dir.mkdir(parents=True)
    (ckpt.dir / "adapter_model.safetensors").write_bytes(b"x" * 100)
    (ckpt.dir / "lora_spec.json").write_text(json.dumps(LoraSpec(rank=rank).to_json()))
    Checkpoints.seal(ckpt, owner, {"base_model": "tiny", "user_metadata": user_metadata})
    if created is not None:  # a fixed time, so the order does not hang on the clock's resolution
        meta = json.loads((ckpt.dir / "meta.json").read_text())
        (ckpt.dir / "meta.json").write_text(json.dumps({**meta, "created": created}))
    return ckpt


def test_a_run_is_described_with_its_metadata_and_latest_checkpoints(tmp_path: Path) -> None:
    cps = Checkpoints(tmp_path)
    runs = Runs(cps)
    runs.record("alice", "s1:train:0", base_model="tiny", spec=LoraSpec(rank=4),
                user_metadata={"renderer_name": "role_colon", "step": 3})
    _save(cps, "alice", "s1:train:0", "weights", "a", created=100.0)
    _save(cps, "alice", "s1:train:0", "weights", "b", created=200.0, user_metadata={"k": "v"})
    _save(cps, "alice", "s1:train:0", "sampler_weights", "c", created=150.0)
    run = Runs(cps).get("alice", "s1:train:0")  # another instance: what a restarted server reads
    assert run["training_run_id"] == "s1:train:0" and run["base_model"] == "tiny" and run["is_lora"] is True
    assert run["lora_rank"] == 4 and run["model_owner"] == "alice"
    assert run["user_metadata"] == {"renderer_name": "role_colon", "step": "3"}
    assert run["last_checkpoint"]["checkpoint_id"] == "weights/b"
    assert run["last_checkpoint"]["tinker_path"] == "tinker://s1:train:0/weights/b"
    assert run["last_checkpoint"]["user_metadata"] == {"k": "v"}
    assert run["last_checkpoint"]["size_bytes"] > 100
    assert run["last_sampler_checkpoint"]["checkpoint_type"] == "sampler"
    assert run["last_sampler_checkpoint"]["checkpoint_id"] == "sampler_weights/c"
    later = Runs(cps).get("alice", "s1:train:0", last_request=time.time() + 60)
    assert later["last_request_time"] > run["last_request_time"]
    with pytest.raises(TinkerNotFound):
        runs.get("bob", "s1:train:0")
    with pytest.raises(TinkerNotFound):
        runs.list_checkpoints("bob", "s1:train:0")
    with pytest.raises(TinkerNotFound):
        runs.get("alice", "s1:train:9")
    with pytest.raises(TinkerNotFound):
        runs.get("alice", "../alice")


def test_a_run_without_run_json_is_described_from_its_checkpoints(tmp_path: Path) -> None:
    cps = Checkpoints(tmp_path)
    _save(cps, "alice", "old:train:0", "weights", "w", rank=2, created=50.0)
    run = Runs(cps).get("alice", "old:train:0")
    assert run["lora_rank"] == 2 and run["base_model"] == "tiny" and run["user_metadata"] is None
    assert Runs(cps).ids("alice") == ["old:train:0"]


def test_the_sdk_types_read_the_answers(tmp_path: Path) -> None:
    from tinker import types

    cps = Checkpoints(tmp_path)
    runs = Runs(cps)
    runs.record("alice", "s1:train:0", base_model="tiny", spec=LoraSpec(rank=4), user_metadata=None)
    _save(cps, "alice", "s1:train:0", "weights", "a")
    run = types.TrainingRun.model_validate(runs.get("alice", "s1:train:0"))
    assert run.last_checkpoint is not None and run.last_checkpoint.checkpoint_type == "training"
    parsed = types.ParsedCheckpointTinkerPath.from_tinker_path(run.last_checkpoint.tinker_path)
    assert parsed.checkpoint_id == run.last_checkpoint.checkpoint_id and parsed.training_run_id == "s1:train:0"
    types.TrainingRunsResponse.model_validate(runs.page("alice", 10, 0))
    types.CheckpointsListResponse.model_validate(runs.list_checkpoints("alice", "s1:train:0"))
    types.CheckpointsListResponse.model_validate(runs.user_checkpoints("alice", 10, 0))


def test_pages_of_runs_and_of_all_checkpoints(tmp_path: Path) -> None:
    cps = Checkpoints(tmp_path)
    runs = Runs(cps)
    for i in range(3):
        runs.record("alice", f"s:train:{i}", base_model="tiny", spec=LoraSpec(rank=4), user_metadata=None)
        _save(cps, "alice", f"s:train:{i}", "weights", "w", created=1000.0 + i)
    runs.record("bob", "t:train:0", base_model="tiny", spec=LoraSpec(rank=4), user_metadata=None)
    page = runs.page("alice", 2, 0, {"s:train:0": time.time() + 60})  # run 0 used last
    assert [r["training_run_id"] for r in page["training_runs"]] == ["s:train:0", "s:train:2"]
    assert page["cursor"] == {"offset": 0, "limit": 2, "total_count": 3}
    rest = runs.page("alice", 2, 2)
    assert len(rest["training_runs"]) == 1 and rest["cursor"]["total_count"] == 3
    assert runs.page("bob", 20, 0)["cursor"]["total_count"] == 1
    assert runs.page("carol", 20, 0) == {"training_runs": [], "cursor": {"offset": 0, "limit": 20, "total_count": 0}}
    every = runs.user_checkpoints("alice", 2, 0)
    assert [c["tinker_path"] for c in every["checkpoints"]] == ["tinker://s:train:2/weights/w",
                                                                  "tinker://s:train:1/weights/w"]
    assert every["cursor"]["total_count"] == 3
    with pytest.raises(TinkerUserError):
        runs.page("alice", -1, 0)


def test_a_deleted_checkpoint_is_gone_and_only_its_owner_can_delete_it(tmp_path: Path) -> None:
    cps = Checkpoints(tmp_path)
    runs = Runs(cps)
    runs.record("alice", "s:train:0", base_model="tiny", spec=LoraSpec(rank=4), user_metadata=None)
    ckpt = _save(cps, "alice", "s:train:0", "weights", "w")
    _save(cps, "alice", "s:train:0", "sampler_weights", "w")
    with pytest.raises(TinkerNotFound):
        runs.delete("bob", "s:train:0", "weights/w")
    with pytest.raises(TinkerUserError):
        runs.delete("alice", "s:train:0", "w")  # not weights/NAME or sampler_weights/NAME
    runs.delete("alice", "s:train:0", "weights/w")
    assert not ckpt.dir.exists()
    assert [c["checkpoint_id"] for c in runs.list_checkpoints("alice", "s:train:0")["checkpoints"]] == [
        "sampler_weights/w"]
    with pytest.raises(TinkerNotFound):
        cps.find(ckpt.path, "alice")
    with pytest.raises(TinkerNotFound):
        runs.delete("alice", "s:train:0", "weights/w")


def test_metadata_values_become_strings() -> None:
    assert string_metadata({"a": "x", "b": 1, "c": [1]}) == {"a": "x", "b": "1", "c": "[1]"}
    assert string_metadata(None) is None


async def test_create_model_writes_the_run_and_the_app_serves_it(tmp_path: Path) -> None:
    """A model made through the service leaves its run.json; the app answers the SDK's listing routes with it,
    and another key's requests are not found."""
    from agentrl.tinker.app import build_app
    from agentrl.tinker.keys import Keys, owner_of
    from agentrl.tinker.sampling import Sampling

    svc = TinkerService(FakeTrainer(), Checkpoints(tmp_path), model_name="tiny", model_dir=tmp_path,  # type: ignore[arg-type]
                        max_context=512)
    key_a, key_b = "tml-unit-test-key-a", "tml-unit-test-key-b"
    alice = owner_of(key_a)
    sid = svc.create_session(alice)
    lora = SimpleNamespace(rank=8, seed=None, train_mlp=True, train_attn=True, train_unembed=True)
    req = SimpleNamespace(session_id=sid, model_seq_id=0, base_model="tiny", lora_config=lora,
                          optimizer_config=SimpleNamespace(type="adamw"), user_metadata={"renderer_name": "r"})
    fut = svc.create_model(alice, req)
    await asyncio.wait_for(fut.done.wait(), 5)
    model_id = f"{sid}:train:0"
    assert json.loads((svc.checkpoints.run_dir(alice, model_id) / "run.json").read_text())["lora"]["rank"] == 8
    _save(svc.checkpoints, alice, model_id, "weights", "s1")

    async def no_engine() -> Any:
        raise AssertionError("listing needs no sampling engine")

    app = build_app(svc, Sampling(svc, no_engine), Keys([key_a, key_b]))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=10) as http:
        a, b = {"X-API-Key": key_a}, {"X-API-Key": key_b}
        run = (await http.get(f"/api/v1/training_runs/{model_id}", params={"access_scope": "owned"}, headers=a)).json()
        assert run["user_metadata"] == {"renderer_name": "r"} and run["lora_rank"] == 8
        assert run["model_owner"] == alice and key_a not in json.dumps(run)
        listed = (await http.get("/api/v1/training_runs", params={"limit": 5, "offset": 0}, headers=a)).json()
        assert [r["training_run_id"] for r in listed["training_runs"]] == [model_id]
        r = await http.get(f"/api/v1/training_runs/{model_id}/checkpoints", headers=a)
        assert [c["checkpoint_id"] for c in r.json()["checkpoints"]] == ["weights/s1"]
        assert (await http.get("/api/v1/checkpoints", headers=a)).json()["cursor"]["total_count"] == 1
        r = await http.get(f"/api/v1/training_runs/{model_id}", headers=b)
        assert r.status_code == 404 and r.json()["error"] == "tinker.not_found"
        assert (await http.get(f"/api/v1/training_runs/{model_id}/checkpoints", headers=b)).status_code == 404
        assert (await http.delete(f"/api/v1/training_runs/{model_id}/checkpoints/weights/s1", headers=b)).status_code == 404
        assert (await http.get("/api/v1/training_runs", headers=b)).json()["training_runs"] == []
        assert (await http.get("/api/v1/training_runs", params={"limit": "x"}, headers=a)).status_code == 400
        assert (await http.get("/api/v1/training_runs", params={"project_id": "p"}, headers=a)).status_code == 400
        assert (await http.get(f"/api/v1/training_runs/{model_id}", params={"access_scope": "all"},
                               headers=a)).status_code == 400
        r = await http.delete(f"/api/v1/training_runs/{model_id}/checkpoints/weights/s1", headers=a)
        assert r.status_code == 200
        assert (await http.get(f"/api/v1/training_runs/{model_id}/checkpoints", headers=a)).json()["checkpoints"] == []
