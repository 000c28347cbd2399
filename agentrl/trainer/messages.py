"""The trainer's RPC messages: what the orchestrator (:class:`agentrl.trainer.client.TrainerProcess`) sends
rank 0 of the ``torchrun`` job (:mod:`agentrl.trainer.worker`), and what rank 0 answers. Both sides import
this one module, so the two cannot drift.

The wire is a ``multiprocessing.connection`` (pickle, authenticated). The orchestrator sends one
:class:`Call`: an id and a :class:`Request`, one small frozen dataclass per op. Rank 0 broadcasts what it
received to the other ranks (every message here pickles), every rank runs the op, and rank 0 answers one
:class:`Reply` with the call's id: ``ok`` and the op's ``result``, or the error (``"Type: message"``) and
the remote traceback. Before the first call, rank 0 sends a :class:`Reply` with no id once the model is built
(``result``: the worker's info, ``ready``), or the error that stopped it.

Besides the calls, rank 0 hands its ranks three messages of its own: :class:`Heartbeat` (nothing arrived for
``heartbeat_s``), :class:`PeerGone` (the orchestrator's connection closed: shut down without a reply) and
:class:`Invalid` (something that is not a call of a known request type: answered with an error, the worker
keeps serving).

This module imports only the standard library and :mod:`agentrl.core.types` (cheap for the worker and the client).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from agentrl.core.types import TrainSample

__all__ = [
    "Call",
    "GetAdapterTensors",
    "Heartbeat",
    "Invalid",
    "LoadCheckpoint",
    "Logprobs",
    "NcclSendWeights",
    "PeerGone",
    "Ping",
    "Reply",
    "Request",
    "SaveAdapter",
    "SaveCheckpoint",
    "Shutdown",
    "Train",
    "WeightSpecs",
    "WriteAdapter",
    "WriteWeightBucket",
    "op_name",
    "requests",
]


# ----------------------------------------------------------------- requests (orchestrator -> every rank)
@dataclass(frozen=True)
class Request:
    """One op for the trainer's ranks; each subclass is an op and names it in ``op`` (logs, error messages).
    The base class itself is no op: the worker answers it as an unknown one."""

    op: ClassVar[str] = "request"


@dataclass(frozen=True)
class Ping(Request):
    """Is the worker serving? Result: ``optimizer_step``."""

    op: ClassVar[str] = "ping"


@dataclass(frozen=True)
class Train(Request):
    """Train on ``samples``, a batch of policy ``policy_version`` (the orchestrator's version, which staleness
    is measured against). Result: the step's metrics (``loss``, ``grad_norm``, ``optimizer_step``, ...)."""

    op: ClassVar[str] = "train"
    samples: list[TrainSample]
    policy_version: int


@dataclass(frozen=True)
class Logprobs(Request):
    """The current policy's per-token logprobs of ``samples``; no update. Result: ``logprobs``."""

    op: ClassVar[str] = "logprobs"
    samples: list[TrainSample]


@dataclass(frozen=True)
class SaveAdapter(Request):
    """Write the adapter (or, with full weights, the whole model) directory at ``path`` (absolute).
    Result: ``path`` and ``bytes``."""

    op: ClassVar[str] = "save_adapter"
    path: str


@dataclass(frozen=True)
class GetAdapterTensors(Request):
    """The trainable tensors, gathered on rank 0. Result: ``format`` (``safetensors``) and ``data`` (bytes)."""

    op: ClassVar[str] = "get_adapter_tensors"


@dataclass(frozen=True)
class WeightSpecs(Request):
    """Every parameter's name and full shape, in model order. Result: ``specs``."""

    op: ClassVar[str] = "weight_specs"


@dataclass(frozen=True)
class WriteAdapter(Request):
    """Write the adapter's tensors into the shared-memory segment ``shm_name`` of ``segment_bytes`` bytes at the
    places of ``layout`` (the publisher's packed layout of what ``GetAdapterTensors`` returned), the B tensors
    multiplied by ``b_scale`` when given: no serialised copy crosses the connection. A single-rank trainer whose
    adapter was gathered once only (:func:`agentrl.trainer.model.planned_trainable`). Result: ``written``
    (False: gather with ``GetAdapterTensors`` instead) and ``write_ms``."""

    op: ClassVar[str] = "write_adapter"
    layout: list[Any]
    shm_name: str
    segment_bytes: int
    b_scale: float | None = None


@dataclass(frozen=True)
class WriteWeightBucket(Request):
    """Gather one bucket of full weights (``layout``) and write it at ``offset`` of the shared-memory segment
    ``shm_name`` of ``segment_bytes`` bytes (:mod:`agentrl.trainer.weights`). Result: ``written``, ``data``
    (the bucket's bytes when not written), ``gather_ms``, ``write_ms``."""

    op: ClassVar[str] = "write_weight_bucket"
    layout: list[Any]
    shm_name: str | None = None
    segment_bytes: int = 0
    offset: int = 0


@dataclass(frozen=True)
class NcclSendWeights(Request):
    """Broadcast the full weights into the engines ``urls`` through vLLM's NCCL weight-transfer engine
    (:mod:`agentrl.trainer.nccl_sync`; ``master_address``: rank 0's address, reachable from the engines)."""

    op: ClassVar[str] = "nccl_send_weights"
    urls: list[str]
    master_address: str


@dataclass(frozen=True)
class SaveCheckpoint(Request):
    """A sharded checkpoint of the trainable parameters, optimizer, optimizer step and RNGs at ``path``.
    Result: ``path`` and ``optimizer_step``."""

    op: ClassVar[str] = "save_checkpoint"
    path: str


@dataclass(frozen=True)
class LoadCheckpoint(Request):
    """Restore a checkpoint written by :class:`SaveCheckpoint` (any world size). Result: ``path`` and
    ``optimizer_step``."""

    op: ClassVar[str] = "load_checkpoint"
    path: str


@dataclass(frozen=True)
class Shutdown(Request):
    """Stop serving: rank 0 answers, then every rank leaves its request loop."""

    op: ClassVar[str] = "shutdown"


def requests() -> list[type[Request]]:
    """Every op's request type (the subclasses of :class:`Request` defined here)."""
    return [c for c in Request.__subclasses__() if c.__module__ == __name__]


def op_name(request: object) -> str:
    """How logs and errors name ``request``: its ``op``, or the type of something that is no request."""
    return request.op if isinstance(request, Request) else type(request).__name__


# ----------------------------------------------------------------- the envelope and the answer
@dataclass(frozen=True)
class Call:
    """What the orchestrator sends: ``request``, and the ``id`` its :class:`Reply` carries back (a reply to an
    earlier call that timed out is told apart, and dropped, by its id)."""

    id: int
    request: Request


@dataclass(frozen=True)
class Reply:
    """Rank 0's answer: to the call ``id`` (None: the ready message, or a message it could not read), ``ok``
    with the op's ``result``, or ``error`` (``"Type: message"``) with the remote ``traceback``."""

    id: int | None
    ok: bool
    result: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    traceback: str = ""

    def to(self, call_id: int | None) -> Reply:
        """This reply, answering the call ``call_id``."""
        return dataclasses.replace(self, id=call_id)


# ----------------------------------------------------------------- rank 0 -> its ranks (never on the wire)
@dataclass(frozen=True)
class Heartbeat:
    """Nothing arrived for ``heartbeat_s``: every rank loops once more (the other ranks' collective waits stay
    short of their timeout)."""


@dataclass(frozen=True)
class PeerGone:
    """The orchestrator's connection closed: every rank stops serving, and nobody is left to answer."""


@dataclass(frozen=True)
class Invalid:
    """Rank 0 received something it cannot run (``payload``: a short description): answered with an error,
    to call ``id`` when there was a readable one."""

    id: int | None
    payload: str
