"""The local control socket's protocol and routing, on a real socket, with a stand-in for vLLM's engine core
(its input queue drained by a loop thread, as the busy loop does): a message runs in that loop, then the
label and the reset; a failed merge pauses the core; a bad message is answered, not run; a link that breaks
falls back to HTTP where the call carries everything itself, and is reported otherwise. The real engine is
in ``tests/integration/test_lora_sync.py`` and ``test_merged_sync.py``."""

from __future__ import annotations

import asyncio
import queue
import socket
import threading
from typing import Any, ClassVar

import pytest

from agentrl.engine.control import ControlServer
from agentrl.weight_sync.control import ControlledEngines, ControlLink, ControlLinkError, open_links


class FakeCore:
    """vLLM's engine core as the control socket uses it: an input queue drained by one loop thread."""

    def __init__(self, result: dict[str, Any] | None = None) -> None:
        self.input_queue: queue.Queue = queue.Queue()
        self.result = result if result is not None else {"ok": True, "engine_ms": 0.1}
        self.calls: list[tuple[str, dict]] = []
        self.version = ""
        self.resets: list[bool] = []
        self.paused = False
        self.loop_thread: str | None = None
        self.vllm_items: list[Any] = []
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            item = self.input_queue.get()  # then the handler looked up, as vLLM's loop does
            self._handle_client_request(*item)

    def _handle_client_request(self, request_type: Any, request: Any) -> None:
        self.vllm_items.append((request_type, request))

    def collective_rpc(self, method: str, kwargs: dict | None = None) -> list[Any]:
        self.loop_thread = threading.current_thread().name
        self.calls.append((method, kwargs or {}))
        return [dict(self.result)]

    def set_weight_version(self, version: str) -> None:
        self.version = version

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        self.resets.append(reset_running_requests)
        return True

    def pause_scheduler(self, mode: str = "abort", clear_cache: bool = True) -> None:
        self.paused = mode == "keep"


class FakeHttp:
    """The HTTP engine client: records the calls that reach it."""

    def __init__(self, urls: list[str], address: dict[str, str] | None = None) -> None:
        self.endpoints = urls
        self.address = address or {}
        self.calls: list[tuple[str, list[str]]] = []

    def subset(self, urls: list[str]) -> FakeHttp:
        sub = FakeHttp(urls, self.address)
        sub.calls = self.calls
        return sub

    async def collective_rpc(self, method: str, args: Any = None, kwargs: Any = None, timeout: Any = None) -> list:
        self.calls.append((method, list(self.endpoints)))
        if method == "agentrl_open_control":
            return [[{"ok": True, "address": self.address[u]}] if u in self.address else
                    [{"ok": False, "code": "weight_sync.update_refused", "error": "no engine core here"}]
                    for u in self.endpoints]
        return [[{"ok": True, "engine_ms": 9.0, "over": "http"}] for _ in self.endpoints]


def test_a_message_runs_in_the_core_loop_then_labels_and_resets() -> None:
    core = FakeCore()
    server = ControlServer(core)

    async def go() -> dict:
        link = await ControlLink.connect("http://e0", server.address)
        try:
            return await link.call("agentrl_merge_lora", {"shm_name": "x"}, version="7", reset="running")
        finally:
            link.close()

    out = asyncio.run(go())
    assert out["workers"] == [{"ok": True, "engine_ms": 0.1}] and out["version_set"] and out["prefix_reset"]
    assert core.calls == [("agentrl_merge_lora", {"shm_name": "x"})]
    assert core.loop_thread != "agentrl-control-conn"  # run by the core's own loop, not the socket's reader
    assert core.version == "7" and core.resets == [True] and not core.paused
    assert out["queue_ms"] >= 0 and out["core_ms"] >= out["rpc_ms"] >= 0


def test_a_failed_merge_pauses_the_core_and_is_not_labelled() -> None:
    core = FakeCore({"ok": False, "code": "weight_sync.update_refused", "error": "does not fit"})
    server = ControlServer(core)

    async def go() -> dict:
        link = await ControlLink.connect("http://e0", server.address)
        try:
            return await link.call("agentrl_merge_lora", {}, version="8", reset="running", pause_on_failure=True)
        finally:
            link.close()

    out = asyncio.run(go())
    assert out["paused"] and core.paused and core.version == "" and core.resets == []
    assert out["workers"][0]["error"] == "does not fit"


def test_only_the_sync_methods_are_accepted_and_bad_messages_are_answered() -> None:
    core = FakeCore()
    server = ControlServer(core)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.connect("\0" + server.address)
        s.send(b'{"id": 1, "method": "agentrl_begin_weights", "kwargs": {}}')
        first = s.recv(1 << 16)
        s.send(b"not json")
        second = s.recv(1 << 16)
    for reply in (first, second):
        assert b"weight_sync.bad_request" in reply
    assert core.calls == []


async def test_control_and_http_engines_side_by_side_in_endpoint_order() -> None:
    core = FakeCore()
    server = ControlServer(core)
    http = FakeHttp(["http://a", "http://b"], {"http://b": server.address})
    links = await open_links(http, http.endpoints)
    assert list(links) == ["http://b"]  # a refuses (no engine core in its process): HTTP
    engines = ControlledEngines(http, links)
    assert not engines.atomic and engines.subset(["http://b"]).atomic
    try:
        out = await engines.collective_rpc("agentrl_update_lora", kwargs={"adapter": "p"})
        assert out[0] == [{"ok": True, "engine_ms": 9.0, "over": "http"}]
        assert out[1][0]["engine_ms"] == 0.1 and out[1][0]["control_core_ms"] >= 0
        assert ("agentrl_update_lora", ["http://a"]) in http.calls
    finally:
        engines.close()


async def test_a_broken_link_falls_back_to_http_or_says_so() -> None:
    core = FakeCore()
    server = ControlServer(core)
    http = FakeHttp(["http://b"], {"http://b": server.address})
    engines = ControlledEngines(http, await open_links(http, ["http://b"]))
    engines.links["http://b"].sock.close()  # the engine went away under the link
    # the in-place copy carries its label and reset in its own arguments: sent again over HTTP at once
    out = await engines.collective_rpc("agentrl_update_lora", kwargs={"adapter": "p"})
    assert out == [[{"ok": True, "engine_ms": 9.0, "over": "http"}]] and not engines.links and not engines.atomic
    # a merge needs the engine core's label, reset and pause: its publisher redoes it the HTTP way
    engines = ControlledEngines(http, await open_links(http, ["http://b"]))
    engines.links["http://b"].sock.close()
    out = await engines.collective_rpc("agentrl_merge_lora", kwargs={}, version="3", reset="running",
                                       pause_on_failure=True)
    assert out[0][0]["link_failed"] and not out[0][0]["ok"]


async def test_a_link_to_a_closed_socket_is_refused() -> None:
    with pytest.raises(OSError):
        await ControlLink.connect("http://gone", "agentrl-control-nobody-listens")
    link = ControlLink("http://x", "a", socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET))
    link.close()
    with pytest.raises(ControlLinkError, match="closed"):
        await link.call("agentrl_update_lora", {})


async def test_an_engine_whose_link_and_http_both_fail_leaves_the_rotation_and_the_others_keep_theirs() -> None:
    """Engine b was killed: its link breaks and HTTP fails too; a, over its own link, applied the update, so
    the call answers a's record and a ``down`` marker for b (b leaves the rotation), as the HTTP client would."""
    from agentrl.core.errors import EngineError

    class DeadB(FakeHttp):
        taken_out: ClassVar[list[str]] = []

        def subset(self, urls: list[str]) -> DeadB:
            sub = DeadB(urls, self.address)
            sub.calls = self.calls
            return sub

        async def collective_rpc(self, method: str, args: Any = None, kwargs: Any = None, timeout: Any = None) -> list:
            if method != "agentrl_open_control" and "http://b" in self.endpoints:
                raise EngineError("http://b: connection refused")
            return await super().collective_rpc(method, args, kwargs, timeout)

        def take_out(self, url: str, reason: str) -> None:
            DeadB.taken_out.append(url)

    a, b = ControlServer(FakeCore()), ControlServer(FakeCore())
    http = DeadB(["http://a", "http://b"], {"http://a": a.address, "http://b": b.address})
    engines = ControlledEngines(http, await open_links(http, http.endpoints))
    assert engines.atomic
    engines.links["http://b"].sock.close()
    try:
        out = await engines.collective_rpc("agentrl_update_lora", kwargs={"adapter": "p"})
    finally:
        engines.close()
    assert out[0][0]["ok"] and out[0][0]["engine_ms"] == 0.1
    assert out[1] == [{"ok": False, "down": True, "error": "http://b is out of rotation"}]
    assert DeadB.taken_out == ["http://b"]
