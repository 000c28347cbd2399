"""The trainer's RPC in-process: typed messages that pickle, the worker's dispatch on their type, and the
request loop over a real ``multiprocessing`` pipe (one-rank gloo world), driven by ``TrainerProcess``."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import re
import threading
import time
from collections.abc import Iterator
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from agentrl.config.trainer import TrainerConfig
from agentrl.core.types import TrainSample
from agentrl.trainer import messages as m
from agentrl.trainer.client import TrainerError, TrainerProcess
from agentrl.trainer.worker import UnknownOp, Worker, _next_request, serve

SAMPLE = TrainSample(input_ids=[1, 2, 3], loss_mask=[0, 1, 1], behav_logprobs=[0.0, -1.0, -2.0], advantage=0.5,
                     versions=[-1, 0, 0])
EXAMPLES: list[m.Request] = [
    m.Ping(), m.Train([SAMPLE], 3), m.Logprobs([SAMPLE]), m.SaveAdapter("/a"), m.GetAdapterTensors(),
    m.WeightSpecs(), m.WriteWeightBucket([["w", [2, 2], "float32"]], "seg", 64, 16),
    m.WriteAdapter([["a.lora_A.weight", "float32", [2, 4], 0]], "seg", 32, 2.0),
    m.NcclSendWeights(["http://e:1"], "10.0.0.1"), m.SaveCheckpoint("/c"), m.LoadCheckpoint("/c"), m.Shutdown(),
]


def test_every_request_type_pickles_and_is_frozen() -> None:
    assert {type(r) for r in EXAMPLES} == set(m.requests())
    assert len({r.op for r in EXAMPLES}) == len(EXAMPLES), "each op has a name of its own"
    for req in EXAMPLES:
        call = m.Call(7, req)
        assert pickle.loads(pickle.dumps(call)) == call
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.Train([], 0).policy_version = 1  # type: ignore[misc]
    for msg in (m.Reply(1, ok=True, result={"x": 1}), m.Heartbeat(), m.PeerGone(), m.Invalid(None, "x")):
        assert pickle.loads(pickle.dumps(msg)) == msg
    assert m.op_name(m.Train([], 0)) == "train" and m.op_name({"op": "x"}) == "dict"


def test_the_worker_has_a_handler_for_every_request_but_shutdown() -> None:
    assert set(Worker.HANDLERS) == set(m.requests()) - {m.Shutdown}
    worker = Worker.__new__(Worker)  # no model: the dispatch alone
    worker.step = cast(Any, SimpleNamespace(optimizer_step=4))
    assert worker.handle(m.Ping()) == {"optimizer_step": 4}
    with pytest.raises(UnknownOp, match="unknown op 'request'"):
        worker.handle(m.Request())


def test_next_request_reads_calls_and_answers_everything_else() -> None:
    here, there = Pipe()
    assert _next_request(here, 0.01) == m.Heartbeat()
    there.send(m.Call(1, m.Ping()))
    assert _next_request(here, 1.0) == m.Call(1, m.Ping())
    there.send({"op": "ping", "id": 2})  # the old wire format
    assert _next_request(here, 1.0) == m.Invalid(None, repr({"op": "ping", "id": 2}))
    there.send(m.Call(3, cast(Any, "ping")))
    assert _next_request(here, 1.0) == m.Invalid(3, "'ping'")
    there.send_bytes(b"not a pickle")
    bad = _next_request(here, 1.0)
    assert isinstance(bad, m.Invalid) and bad.id is None and "unreadable" in bad.payload
    there.close()
    assert _next_request(here, 1.0) == m.PeerGone()


class Boom(Exception):
    """What the fake worker raises for a checkpoint path that does not exist."""


class FakeWorker:
    """Answers like a worker without a model; records what it ran."""

    def __init__(self) -> None:
        self.ran: list[m.Request] = []

    def handle(self, req: m.Request) -> dict[str, Any]:
        self.ran.append(req)
        match req:
            case m.Train(samples=samples, policy_version=version):
                return {"loss": 0.5, "num_samples": len(samples), "policy_version": version}
            case m.LoadCheckpoint(path=path):
                raise Boom(f"no checkpoint at {path}")
            case m.SaveAdapter(path=path):
                return {"path": path, "bytes": 1}
            case _:
                return {"optimizer_step": 0}


@pytest.fixture
def served(world: None, tmp_path: Path) -> Iterator[tuple[TrainerProcess, FakeWorker, threading.Thread]]:
    """A ``TrainerProcess`` talking to ``serve`` (rank 0 of a one-rank world) in a thread, over a pipe."""
    ours, theirs = Pipe()
    worker = FakeWorker()
    loop = threading.Thread(target=serve, args=(worker, theirs, SimpleNamespace(heartbeat_s=0.05)), daemon=True)
    loop.start()
    tp = TrainerProcess(TrainerConfig(model_path="m"), tmp_path)
    tp.proc = cast(Any, SimpleNamespace(poll=lambda: None))  # "alive"
    tp._conn = cast(Connection, ours)
    try:
        yield tp, worker, loop
    finally:
        if loop.is_alive():
            ours.close()  # the peer is gone: the loop ends
        loop.join(5)


def test_requests_round_trip_through_the_request_loop(served: tuple[TrainerProcess, FakeWorker,
                                                                     threading.Thread]) -> None:
    tp, worker, loop = served

    async def drive() -> dict[str, Any]:
        return await tp.train([SAMPLE, SAMPLE], policy_version=2)

    metrics = asyncio.run(drive())
    assert metrics == {"loss": 0.5, "num_samples": 2, "policy_version": 2}, "the result, no protocol fields"
    assert worker.ran == [m.Train([SAMPLE, SAMPLE], 2)]
    saved = asyncio.run(tp.save_adapter("rel/adapter"))
    assert saved["path"] == str(Path("rel/adapter").resolve()), "paths go out absolute"
    with pytest.raises(TrainerError, match="trainer op 'load_checkpoint' failed: Boom: no checkpoint at") as e:
        asyncio.run(tp.load_checkpoint("/nowhere"))
    assert "raise Boom" in e.value.remote_traceback
    with pytest.raises(TrainerError, match=re.escape("malformed request {'op': 'ping'}")):
        tp.request(cast(Any, {"op": "ping"}), timeout_s=10)
    reply = tp.request(m.Ping(), timeout_s=10)
    assert reply.ok and reply.result == {"optimizer_step": 0} and reply.id is not None, "still serving"
    assert tp.request(m.Shutdown(), timeout_s=10) == m.Reply(reply.id + 1, ok=True)
    loop.join(5)
    assert not loop.is_alive(), "shutdown ends the request loop"


def test_a_request_without_a_handler_is_answered_and_the_worker_keeps_serving(
        world: None, tmp_path: Path) -> None:
    """The real dispatch (``Worker.handle``) behind the request loop: an unknown op is an error reply."""
    ours, theirs = Pipe()
    worker = Worker.__new__(Worker)
    worker.step = cast(Any, SimpleNamespace(optimizer_step=9))
    for call in (m.Call(1, m.Request()), m.Call(2, m.Ping()), m.Call(3, m.Shutdown())):
        ours.send(call)
    serve(worker, theirs, cast(Any, SimpleNamespace(heartbeat_s=0.05)))
    first, second, third = ours.recv(), ours.recv(), ours.recv()
    assert (first.id, first.ok) == (1, False) and first.error == "UnknownOp: unknown op 'request'"
    assert "Traceback" in first.traceback
    assert second == m.Reply(2, ok=True, result={"optimizer_step": 9})
    assert third == m.Reply(3, ok=True)


class _Process:
    """A stand-in for the torchrun process: alive until waited for, and records the waits it got."""

    pid, returncode = -1, 0

    def __init__(self) -> None:
        self.waits: list[float] = []

    def poll(self) -> int | None:
        return 0 if self.waits else None

    def wait(self, timeout: float) -> int:
        self.waits.append(timeout)
        return 0


def test_close_during_a_step_does_not_wait_for_the_step(world: None, tmp_path: Path) -> None:
    """A run interrupted during a training step: the op's thread holds the connection until its reply, so
    ``close`` does not queue a shutdown behind it; it drops the connection (the op's wait ends with an error)
    and gives the process its short wait."""
    ours, theirs = Pipe()
    tp = TrainerProcess(TrainerConfig(model_path="m"), tmp_path)
    proc = _Process()
    tp.proc, tp._conn = cast(Any, proc), cast(Connection, ours)
    errors: list[BaseException] = []

    def step() -> None:
        try:
            tp.request(m.Train([SAMPLE], 1), timeout_s=60)
        except TrainerError as e:
            errors.append(e)

    op = threading.Thread(target=step)
    op.start()
    assert isinstance(theirs.recv(), m.Call), "the step reached the worker, which never answers"
    t0 = time.monotonic()
    assert tp.close(timeout_s=30, busy_wait_s=0.5) == 0
    op.join(5)
    assert not op.is_alive() and time.monotonic() - t0 < 10
    assert proc.waits == [0.5], "the short wait, no shutdown request behind the step"
    assert len(errors) == 1 and "while running op 'train'" in str(errors[0])
    with pytest.raises(EOFError):  # the connection's end, and no Shutdown before it
        theirs.recv()
