"""Weight labels per LoRA adapter (:mod:`agentrl.engine.adapter_labels`), without an engine: the composite
label and its reading, which label a request reads, the engine core's side on a stand-in core (an in-place
sync of one adapter leaves the others' labels and the engine-wide one; with no adapter labelled the per-step
label is vLLM's string unchanged), forgetting on removal, and patches 18 and 20 on vLLM's own classes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from agentrl.engine import adapter_labels, vllm_patches
from agentrl.engine.adapter_labels import (
    ENV,
    PREFIX,
    adapter_name,
    decode,
    encode,
    forget,
    forget_lora_id,
    label_for,
    labels_of,
)
from agentrl.engine.slots import label_and_reset

REGISTRY = {"policy": (1, "/a/policy"), "ref": (2, "/a/ref")}


class _Core:
    """The engine core's label surface, as vLLM 0.32's ``EngineCore`` has it."""

    def __init__(self) -> None:
        self._weight_version = "default"
        self.resets: list[bool] = []

    def set_weight_version(self, weight_version: str) -> None:
        self._weight_version = weight_version

    def get_weight_version(self) -> str:
        return self._weight_version

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        self.resets.append(reset_running_requests)
        return True

    def _attach_weight_version(self, outputs: dict[int, Any]) -> None:
        for eco in outputs.values():
            eco.weight_version = self._weight_version

    def step_label(self) -> str:
        outputs = {0: SimpleNamespace(weight_version=None), 1: SimpleNamespace(weight_version=None)}
        self._attach_weight_version(outputs)
        labels = {eco.weight_version for eco in outputs.values()}
        assert len(labels) == 1, labels
        return labels.pop()


@pytest.fixture
def per_adapter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "1")
    monkeypatch.setattr("agentrl.engine.slots.REGISTRY", dict(REGISTRY))


def test_no_adapter_label_is_the_plain_label_byte_for_byte() -> None:
    assert encode("5", {}) == "5"
    assert decode("5") == ("5", {})
    for name in (None, "policy", "ref"):
        assert label_for("5", name) == "5"
        assert label_for("default", name) == "default"


def test_the_composite_round_trips_and_each_request_reads_its_adapters_label() -> None:
    label = encode("3", {"policy": "5", "ref": "1"})
    assert label.startswith(PREFIX) and label != "3"
    assert decode(label) == ("3", {"policy": "5", "ref": "1"})
    assert encode("3", {"ref": "1", "policy": "5"}) == label  # one string per state, whatever the insertion order
    assert label_for(label, "policy") == "5"
    assert label_for(label, "ref") == "1"
    assert label_for(label, "other") == "3"  # an adapter never labelled on its own: the engine-wide label
    assert label_for(label, None) == "3"  # the base model


@pytest.mark.parametrize("bad", [PREFIX, PREFIX + "{", PREFIX + "[]", PREFIX + '{"base": 1, "adapters": {}}',
                                 PREFIX + '{"base": "1", "adapters": []}'])
def test_a_composite_that_does_not_parse_is_a_plain_label(bad: str) -> None:
    assert decode(bad) == (bad, {})
    assert label_for(bad, "policy") == bad


def test_an_adapter_is_named_as_requests_name_it() -> None:
    assert adapter_name("ref", REGISTRY) == "ref"
    assert adapter_name("2", REGISTRY) == "ref"  # the int id the transports also accept
    assert adapter_name("9", REGISTRY) == ""
    assert adapter_name("never-loaded", REGISTRY) == ""


def test_syncing_one_adapter_leaves_the_others_label(per_adapter: None) -> None:
    core = _Core()
    core.set_weight_version("0")  # POST /update_weight_version: the engine-wide label
    assert core.step_label() == "0"
    out = label_and_reset(core, "5", "1", "policy")
    assert out["version_set"] and out["prefix_reset"]
    out = label_and_reset(core, "1", "", "2")  # ref, by its int id
    assert out["version_set"] and not out["prefix_reset"]
    assert core.get_weight_version() == "0"  # the engine-wide label stays what was set
    step = core.step_label()
    assert (label_for(step, "policy"), label_for(step, "ref"), label_for(step, None)) == ("5", "1", "0")
    label_and_reset(core, "2", "", "ref")
    step = core.step_label()
    assert (label_for(step, "policy"), label_for(step, "ref"), label_for(step, None)) == ("5", "2", "0")
    core.set_weight_version("7")  # the engine-wide label moves; the adapters' own stay
    step = core.step_label()
    assert (label_for(step, "policy"), label_for(step, "ref"), label_for(step, "other")) == ("5", "2", "7")


def test_forgotten_adapters_fall_back_and_the_plain_label_returns(per_adapter: None) -> None:
    core = _Core()
    core.set_weight_version("0")
    label_and_reset(core, "5", "", "policy")
    label_and_reset(core, "1", "", "ref")
    assert forget_lora_id(REGISTRY, 2, find_core=lambda: core) == ["ref"]
    step = core.step_label()
    assert (label_for(step, "policy"), label_for(step, "ref")) == ("5", "0")
    assert forget_lora_id(REGISTRY, 2, find_core=lambda: core) == []
    assert forget_lora_id(REGISTRY, 9, find_core=lambda: pytest.fail("no name: no core looked up")) == []
    assert forget(core, ["policy"]) == ["policy"] and labels_of(core) == {}
    assert core.step_label() == "0"  # no adapter labelled: vLLM's string, byte for byte
    # a worker process of its own has no engine core: nothing to forget there
    assert forget_lora_id(REGISTRY, 1, find_core=lambda: None) == []


def test_without_the_reading_api_server_a_sync_sets_the_engine_wide_label(monkeypatch: pytest.MonkeyPatch) -> None:
    """The single-label path: no composite ever leaves the engine core."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr("agentrl.engine.slots.REGISTRY", dict(REGISTRY))
    core = _Core()
    assert label_and_reset(core, "5", "", "policy")["version_set"]
    assert core.get_weight_version() == "5" and core.step_label() == "5" and labels_of(core) == {}


def test_an_adapter_of_no_known_name_sets_the_engine_wide_label(per_adapter: None) -> None:
    core = _Core()
    label_and_reset(core, "4", "", "9")
    label_and_reset(core, "6", "", "")  # a merge, a full load: the engine
    assert core.step_label() == "6" and labels_of(core) == {}
    assert not label_and_reset(core, "", "", "policy")["version_set"]
    assert labels_of(core) == {}


def test_the_attach_wrap_is_installed_once(per_adapter: None) -> None:
    core = _Core()
    label_and_reset(core, "5", "", "policy")
    wrapped = core._attach_weight_version
    label_and_reset(core, "6", "", "policy")
    assert core._attach_weight_version is wrapped
    empty: dict[int, Any] = {}
    wrapped(empty)
    assert empty == {}  # a step without outputs stays without


def test_enabled_reads_the_flag() -> None:
    assert adapter_labels.enabled({ENV: "1"}) and not adapter_labels.enabled({}) \
        and not adapter_labels.enabled({ENV: "0"})


def test_patch_20_makes_vllms_request_state_track_its_adapters_label() -> None:
    from vllm.v1.engine.output_processor import RequestState

    original = RequestState.track_weight_version
    RequestState.track_weight_version = getattr(original, "_agentrl_original", original)  # type: ignore[method-assign]
    try:
        vllm_patches.patch_request_labels(label_for)
        vllm_patches.patch_request_labels(label_for)  # idempotent
        step = encode("0", {"policy": "5"})
        states = {name: SimpleNamespace(lora_name=name, weight_version_starts=[],
                                        detokenizer=SimpleNamespace(num_output_tokens=lambda: 0))
                  for name in ("policy", "ref", None)}
        for state in states.values():
            RequestState.track_weight_version(state, step)  # type: ignore[arg-type]
            RequestState.track_weight_version(state, "3")  # a plain label passes through
        assert states["policy"].weight_version_starts == [("5", 0), ("3", 0)]
        assert states["ref"].weight_version_starts == [("0", 0), ("3", 0)]
        assert states[None].weight_version_starts == [("0", 0), ("3", 0)]
    finally:
        RequestState.track_weight_version = original  # type: ignore[method-assign]


def test_patch_18_hands_every_removal_to_the_hooks() -> None:
    from vllm.lora.model_manager import LoRAModelManager

    original = LoRAModelManager.deactivate_adapter  # another test may have installed the patches already
    LoRAModelManager.deactivate_adapter = getattr(original, "_agentrl_original", original)  # type: ignore[method-assign]
    seen: list[int] = []
    try:
        vllm_patches.patch_lora_removal([lambda _manager, lora_id: seen.append(lora_id)])
        manager = SimpleNamespace(_active_adapters={}, _deactivate_adapter=lambda _id: None)
        assert LoRAModelManager.deactivate_adapter(manager, 3) is False  # type: ignore[arg-type]
        assert seen == [3]
    finally:
        LoRAModelManager.deactivate_adapter = original  # type: ignore[method-assign]


def test_over_the_control_socket_an_inplace_copy_labels_its_adapter_and_a_merge_the_engine(
        per_adapter: None) -> None:
    import asyncio

    from agentrl.engine.control import ControlServer
    from agentrl.weight_sync.control import ControlLink
    from tests.unit.weight_sync.test_control import FakeCore

    class Core(FakeCore):
        def get_weight_version(self) -> str:
            return self.version

        def _attach_weight_version(self, outputs: dict[int, Any]) -> None:
            for eco in outputs.values():
                eco.weight_version = self.version

    core = Core()
    server = ControlServer(core)

    async def go() -> list[dict]:
        link = await ControlLink.connect("http://e0", server.address)
        try:
            return [await link.call("agentrl_update_lora", {"adapter": "ref", "shm_name": "x"}, version="1"),
                    await link.call("agentrl_merge_lora", {"adapter": "policy", "shm_name": "y"}, version="7")]
        finally:
            link.close()

    outs = asyncio.run(go())
    assert all(o["version_set"] for o in outs), outs
    assert labels_of(core) == {"ref": "1"} and core.version == "7"
    outputs = {0: SimpleNamespace(weight_version=None)}
    core._attach_weight_version(outputs)
    assert (label_for(outputs[0].weight_version, "ref"), label_for(outputs[0].weight_version, "policy")) == ("1", "7")
