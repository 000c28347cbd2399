"""One error root with stable codes: every exception class of agentrl derives from ``AgentRLError`` and has a
code of its own; engine-side weight-sync failures cross ``collective_rpc`` as codes, not as message text."""

from __future__ import annotations

import base64
import importlib
import inspect
import json
import pkgutil
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import torch

import agentrl
from agentrl.core.errors import AgentRLError
from agentrl.inference.client import InferenceClient, InferenceError, NoEnginesError
from agentrl.inference.routing import EndpointPool
from agentrl.weight_sync.base import ADAPTER_NOT_LOADED, BAD_REQUEST, UPDATE_REFUSED
from agentrl.weight_sync.inplace import SyncError
from agentrl.weight_sync.network import UPDATE_BYTES_METHOD, WRITE_METHOD, NetworkAdapterSync

ROOTS = ("agentrl", "agentrl.envs", "agentrl.sandbox")
SKIP = (
    "agentrl.tools.scaffold.example_env_check",  # a template for users to copy, not a module of agentrl
)
NOT_ERRORS = {
    # Control-flow signals, deliberately outside the tree (see the comment at each class):
    "agentrl.environment.base.AgentTimeLimit",  # the episode ends as ``timeout``: an outcome, not a failure
    "agentrl.core.utils.retry.Retry",  # "try again", from an attempt to the retry loop; never reaches a caller
}
CODE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")


def _modules() -> list[str]:
    names: set[str] = set()
    for root in ROOTS:
        pkg = importlib.import_module(root)
        names.add(root)
        for info in pkgutil.walk_packages(pkg.__path__, root + ".", onerror=lambda name: None):
            if not info.name.startswith(SKIP):
                names.add(info.name)
    return sorted(names)


def _exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in an agentrl module, by its qualified name."""
    found: dict[str, type[BaseException]] = {}
    for name in _modules():
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:  # an optional third-party dependency; agentrl's own must import
            if (e.name or "").split(".")[0] == "agentrl":
                raise
            continue
        for obj in vars(module).values():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == name:
                found[f"{name}.{obj.__qualname__}"] = obj
    return found


@pytest.fixture(scope="module")
def classes() -> dict[str, type[BaseException]]:
    return _exception_classes()


def test_every_exception_class_derives_from_agentrl_error(classes: dict[str, type[BaseException]]) -> None:
    assert len(classes) >= 30, sorted(classes)  # the walk found the modules
    outside = sorted(n for n, c in classes.items() if not issubclass(c, AgentRLError) and n not in NOT_ERRORS)
    assert not outside, f"derive these from agentrl.core.errors.AgentRLError (or allow-list them with a reason): {outside}"
    assert all(n in classes and not issubclass(classes[n], AgentRLError) for n in NOT_ERRORS), "stale allow-list"


def test_codes_are_stable_strings_unique_per_class(classes: dict[str, type[BaseException]]) -> None:
    errors = {n: c for n, c in classes.items() if issubclass(c, AgentRLError)}
    missing = sorted(n for n, c in errors.items() if "code" not in vars(c))
    assert not missing, f"each class sets its own ``code``: {missing}"
    bad = sorted(f"{n}: {c.code!r}" for n, c in errors.items() if not (isinstance(c.code, str) and CODE.match(c.code)))
    assert not bad, bad
    by_code: dict[str, list[str]] = {}
    for n, c in errors.items():
        by_code.setdefault(c.code, []).append(n)
    assert {k: v for k, v in by_code.items() if len(v) > 1} == {}


def test_builtin_bases_are_kept() -> None:
    from agentrl.environment.registry import UnknownEnvironmentError
    from agentrl.orchestrator.rundir import RunDirError
    from agentrl.trainer.client import TrainerError

    assert issubclass(RunDirError, ValueError) and issubclass(TrainerError, RuntimeError)
    assert issubclass(UnknownEnvironmentError, LookupError)
    assert agentrl.AgentRLError is AgentRLError and "AgentRLError" in agentrl.__all__


def test_wire_codes_refine_the_class_code() -> None:
    from agentrl.environment.remote import RemoteEnvError
    from agentrl.http.errors import ApiError

    assert ApiError(404, "gone").code == "not_found" and ApiError(409, "x", code="busy").code == "busy"
    assert RemoteEnvError("x", code="env_error").code == "env_error"
    assert RemoteEnvError("unreachable").code == RemoteEnvError.code == "env.remote"


def test_no_live_engine_is_no_engines_error() -> None:
    """The pool's "every endpoint is out of rotation" and the client's are one class (still a RuntimeError)."""
    pool = EndpointPool(["http://a"])
    pool.mark_down("http://a", "dead")
    with pytest.raises(NoEnginesError, match="out of rotation") as info:
        pool.pick()
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, InferenceError)
    assert info.value.code == "inference.no_engines"


# -- the engine side: failure records carry a code -------------------------------------------------------

def _worker(manager: Any) -> Any:
    from agentrl.engine.extension import WorkerExtension

    worker = WorkerExtension()
    worker.model_runner = SimpleNamespace(lora_manager=SimpleNamespace(_adapter_manager=manager))  # type: ignore[attr-defined]
    return worker


def _bytes_call(worker: Any, adapter: str, payload: bytes = b"\0" * 8, nbytes: int = 8) -> dict[str, Any]:
    meta = json.dumps({"nbytes": nbytes, "tensors": []})
    return worker.agentrl_update_lora_bytes(adapter, base64.b64encode(payload).decode(), meta, layout_id="t")


def test_engine_reports_failures_as_codes() -> None:
    no_slot = SimpleNamespace(get_adapter=lambda lora_id: None, lora_index_to_id=[])
    for adapter in ("never-loaded", "7"):  # unknown name; a known int id without a loaded adapter
        out = _bytes_call(_worker(no_slot), adapter)
        assert out["ok"] is False and out["code"] == ADAPTER_NOT_LOADED, out
    out = _bytes_call(_worker(None), "7")  # LoRA not enabled on the worker
    assert (out["ok"], out["code"]) == (False, UPDATE_REFUSED), out
    out = _bytes_call(_worker(no_slot), "7", payload=b"\0" * 4)  # not the announced size
    assert (out["ok"], out["code"]) == (False, UPDATE_REFUSED), out
    out = _worker(no_slot).agentrl_update_lora_bytes("7", "not base64!", json.dumps({"nbytes": 8, "tensors": []}))
    assert (out["ok"], out["code"]) == (False, BAD_REQUEST), out
    json.dumps(out)  # crosses vLLM's collective_rpc route as JSON


# -- the client side: it branches on the code, never on the text ----------------------------------------

class _Trainer:
    def __init__(self) -> None:
        self.saved = 0

    async def get_adapter_tensors(self) -> dict[str, torch.Tensor]:
        return {"base_model.model.layers.0.q_proj.lora_A.weight": torch.ones(2, 4)}

    async def save_adapter(self, path: Path) -> dict[str, Any]:
        self.saved += 1
        Path(path).mkdir(parents=True)
        (Path(path) / "adapter_config.json").write_text("{}")
        return {}


def _engine(record: dict[str, Any], calls: list[str]) -> InferenceClient:
    """One engine whose update answers ``record`` (as vLLM's ``POST /collective_rpc`` returns a dict result)."""

    def handler(req: httpx.Request) -> httpx.Response:
        body = json.loads(req.content) if req.content else {}
        calls.append(body.get("method") or req.url.path)
        if req.url.path == "/collective_rpc" and body["method"] == UPDATE_BYTES_METHOD:
            return httpx.Response(200, json={"results": [record]})
        if req.url.path == "/collective_rpc" and body["method"] == WRITE_METHOD:
            return httpx.Response(200, json={"results": [{"ok": True, "path": "/tmp/x"}]})
        return httpx.Response(200, json={})

    return InferenceClient(["http://e"], transport=httpx.MockTransport(handler), backoff_s=0.001)


async def test_client_creates_the_slot_on_the_not_loaded_code(tmp_path: Path) -> None:
    calls: list[str] = []
    trainer = _Trainer()
    record = {"ok": False, "code": ADAPTER_NOT_LOADED, "error": "any wording at all"}
    async with _engine(record, calls) as engine:
        out = await NetworkAdapterSync(trainer, engine, "p", tmp_path).publish(1)
    assert out["network_slots_created"] == 1.0 and trainer.saved == 1
    assert calls[:3] == [UPDATE_BYTES_METHOD, WRITE_METHOD, "/v1/load_lora_adapter"]


async def test_client_does_not_read_the_message(tmp_path: Path) -> None:
    """The text that used to be matched, under another code, is a refusal like any other."""
    calls: list[str] = []
    record = {"ok": False, "code": UPDATE_REFUSED, "error": "adapter 'p' was never loaded on this worker"}
    async with _engine(record, calls) as engine:
        with pytest.raises(SyncError, match="never loaded") as info:
            await NetworkAdapterSync(_Trainer(), engine, "p", tmp_path).publish(1)
    assert info.value.code == "weight_sync.publish_failed" and calls == [UPDATE_BYTES_METHOD]


async def test_unload_of_a_missing_adapter_is_recognised_by_vllm_error_type() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        kind = "NotFoundError" if req.url.host == "a" else "BadRequestError"
        return httpx.Response(404 if kind == "NotFoundError" else 400,
                              json={"error": {"message": "The lora adapter 'p' cannot be found.", "type": kind}})

    async with InferenceClient(["http://a"], transport=httpx.MockTransport(handler)) as c:
        await c.unload_lora_adapter("p")  # vLLM's NotFoundError: missing is fine
    async with InferenceClient(["http://b"], transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(InferenceError, match="cannot be found"):  # same text, another type: an error
            await c.unload_lora_adapter("p")
