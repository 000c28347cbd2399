"""The trainer worker: ``torchrun --nproc_per_node N -m agentrl.trainer.worker --config cfg.json``.

Rank 0 connects to the orchestrator (``AGENTRL_TRAINER_ADDR`` = ``host:port``, ``AGENTRL_TRAINER_AUTHKEY``
= hex) and first sends a :class:`~agentrl.trainer.messages.Reply` without an id once the model is built
(``result``: :meth:`Worker.info` and ``ready``). Then, for every :class:`~agentrl.trainer.messages.Call` it
receives, it broadcasts the call to all ranks, every rank runs its request (:meth:`Worker.handle`
dispatches on the request's type), and rank 0 replies ``Reply(id, ok=True, result=...)`` or
``Reply(id, ok=False, error="Type: msg", traceback=...)``. The requests (:mod:`agentrl.trainer.messages`):
``Train``, ``Logprobs`` (the current policy's per-token logprobs, no update), ``SaveAdapter``,
``GetAdapterTensors``, ``WriteAdapter`` (the adapter straight into the publisher's segment), ``WeightSpecs`` and
``WriteWeightBucket`` (full-weight sync, one bucket per call:
:mod:`agentrl.trainer.weights`), ``NcclSendWeights`` (full weights through vLLM's NCCL weight-transfer engine:
:mod:`agentrl.trainer.nccl_sync`), ``SaveCheckpoint``, ``LoadCheckpoint``, ``Ping``, ``Shutdown``. An op that
raises on every rank (bad arguments, a missing path), a request of a type the worker has no handler for, and
a message that is no call (or cannot be unpickled) are answered with an error and leave the worker serving; a
rank failing alone inside a collective is fatal.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import logging
import os
import pickle
import sys
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from agentrl.config.trainer import TrainerConfig
from agentrl.core.errors import AgentRLError
from agentrl.trainer import model as model_io
from agentrl.trainer.errors import TrainerSettingError
from agentrl.trainer.messages import (
    Call,
    GetAdapterTensors,
    Heartbeat,
    Invalid,
    LoadCheckpoint,
    Logprobs,
    NcclSendWeights,
    PeerGone,
    Ping,
    Reply,
    Request,
    SaveAdapter,
    SaveCheckpoint,
    Shutdown,
    Train,
    WeightSpecs,
    WriteAdapter,
    WriteWeightBucket,
)
from agentrl.trainer.train_step import TrainStep
from agentrl.trainer.weights import BucketWriter, weight_specs

log = logging.getLogger("agentrl.trainer")

Incoming = Call | Heartbeat | PeerGone | Invalid
"""What rank 0 hands every rank each turn of the request loop."""


class UnknownOp(AgentRLError, ValueError):
    """The client asked rank 0 for an op the worker does not have."""

    code = "trainer.unknown_op"


class Handles(Protocol):
    """What the request loop needs of a rank's worker: run one request, return its result."""

    def handle(self, req: Request) -> dict[str, Any]: ...


class Worker:
    """One rank's model, optimizer and op handlers (:attr:`HANDLERS`: one method per request type)."""

    def __init__(self, cfg: TrainerConfig) -> None:
        self.cfg = cfg
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.device = model_io.resolve_device(cfg, int(os.environ.get("LOCAL_RANK", "0")))
        torch.manual_seed(cfg.seed)
        if cfg.loss.kl_coef > 0 and not cfg.lora:
            raise TrainerSettingError("loss.kl_coef > 0 needs lora=True (the reference policy is the base model)")
        mesh = init_device_mesh(self.device.type, (self.world,))
        self.model = model_io.build_model(cfg, mesh, self.device)
        groups = model_io.optimizer_groups(self.model)
        self.optimizer = torch.optim.AdamW(
            groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.adam_eps, weight_decay=cfg.weight_decay
        )
        params = [p for g in groups for p in g["params"]]
        self.step = TrainStep(self.model, self.optimizer, cfg, self.device,
                              replay=model_io.routing_replay(self.model, cfg))
        self.num_trainable = sum(p.numel() for p in params)
        self.buckets = BucketWriter()
        self.nccl: Any = None  # agentrl.trainer.nccl_sync.NcclSender, on the first NCCL sync

    def info(self) -> dict[str, Any]:
        """What the ready message tells the orchestrator."""
        return {
            "world_size": self.world,
            "device": str(self.device),
            "lora": self.cfg.lora,
            "trainable_params": self.num_trainable,
            "optimizer_step": self.step.optimizer_step,
            "pid": os.getpid(),
        }

    def handle(self, req: Request) -> dict[str, Any]:
        """Run one request on this rank (its handler, by the request's exact type); the returned dict is the
        reply's result (meaningful on rank 0). Raises :class:`UnknownOp` for a type without a handler."""
        handler = self.HANDLERS.get(type(req))
        if handler is None:
            raise UnknownOp(f"unknown op {getattr(req, 'op', type(req).__name__)!r}")
        return handler(self, req)

    # ----------------------------------------------------------------- one handler per request type
    def _ping(self, req: Ping) -> dict[str, Any]:
        return {"optimizer_step": self.step.optimizer_step}

    def _train(self, req: Train) -> dict[str, Any]:
        return self.step.train(req.samples, int(req.policy_version))

    def _logprobs(self, req: Logprobs) -> dict[str, Any]:
        return {"logprobs": self.step.score(req.samples)}

    def _save_adapter(self, req: SaveAdapter) -> dict[str, Any]:
        size = model_io.save_adapter(self.model, self.cfg, req.path)
        return {"path": str(Path(req.path).resolve()), "bytes": size}

    def _get_adapter_tensors(self, req: GetAdapterTensors) -> dict[str, Any]:
        from safetensors.torch import save

        tensors = model_io.gather_trainable(self.model, self.cfg)
        data = save(tensors) if self.rank == 0 else b""
        return {"format": "safetensors", "data": data}

    def _weight_specs(self, req: WeightSpecs) -> dict[str, Any]:
        return {"specs": weight_specs(self.model)}

    def _write_adapter(self, req: WriteAdapter) -> dict[str, Any]:
        return self.buckets.write_adapter(model_io.planned_trainable(self.model), req.layout, req.shm_name, int(req.segment_bytes), req.b_scale)

    def _write_weight_bucket(self, req: WriteWeightBucket) -> dict[str, Any]:
        return self.buckets.write(self.model, req.layout, req.shm_name, int(req.segment_bytes), int(req.offset))

    def _nccl_send_weights(self, req: NcclSendWeights) -> dict[str, Any]:
        if self.nccl is None:
            from agentrl.trainer.nccl_sync import NcclSender

            self.nccl = NcclSender(self.model)
        return self.nccl.send(list(req.urls), str(req.master_address))

    def _save_checkpoint(self, req: SaveCheckpoint) -> dict[str, Any]:
        model_io.save_checkpoint(self.model, self.optimizer, self.cfg, req.path, self.step.optimizer_step)
        return {"path": str(req.path), "optimizer_step": self.step.optimizer_step}

    def _load_checkpoint(self, req: LoadCheckpoint) -> dict[str, Any]:
        step = model_io.load_checkpoint(self.model, self.optimizer, self.cfg, req.path)
        self.step.optimizer_step = step
        return {"path": str(req.path), "optimizer_step": step}

    HANDLERS: ClassVar[dict[type[Request], Callable[[Any, Any], dict[str, Any]]]] = {
        Ping: _ping,
        Train: _train,
        Logprobs: _logprobs,
        SaveAdapter: _save_adapter,
        GetAdapterTensors: _get_adapter_tensors,
        WeightSpecs: _weight_specs,
        WriteAdapter: _write_adapter,
        WriteWeightBucket: _write_weight_bucket,
        NcclSendWeights: _nccl_send_weights,
        SaveCheckpoint: _save_checkpoint,
        LoadCheckpoint: _load_checkpoint,
    }
    """The handler of each request type (``Shutdown`` is the request loop's own)."""


def _error(exc: BaseException, call_id: int | None = None) -> Reply:
    """The error reply for ``exc`` (call from its ``except`` block: the traceback is the one being handled)."""
    return Reply(call_id, ok=False, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())


def _next_request(conn: Connection, heartbeat_s: float) -> Incoming:
    """Rank 0: the next call, a heartbeat after ``heartbeat_s`` idle, :class:`PeerGone` if the peer left, or
    :class:`Invalid` for a message that is no call of a request (or cannot be unpickled at all)."""
    try:
        if not conn.poll(heartbeat_s):
            return Heartbeat()
        data = conn.recv_bytes()
    except (EOFError, OSError):
        log.warning("orchestrator connection closed: shutting down")
        return PeerGone()
    try:
        msg = pickle.loads(data)
    except Exception as exc:  # a class this side cannot import, or not a pickle: answered, never fatal
        return Invalid(None, f"(unreadable: {type(exc).__name__}: {exc})"[:200])
    if not isinstance(msg, Call):
        return Invalid(None, repr(msg)[:200])
    if not isinstance(msg.request, Request):
        return Invalid(msg.id, repr(msg.request)[:200])
    return msg


def _run_call(worker: Handles | None, call: Call, world: int) -> Reply:
    """Every rank: run ``call``'s request; the reply (rank 0's is sent), failed if any rank failed."""
    op = call.request.op
    t0 = time.perf_counter()
    try:
        assert worker is not None
        reply = Reply(call.id, ok=True, result=worker.handle(call.request))
    except Exception as exc:
        log.exception("op %s failed", op)
        reply = _error(exc, call.id)
    if world > 1:
        errors: list[Reply | None] = [None] * world
        dist.all_gather_object(errors, None if reply.ok else reply)
        failed = [e for e in errors if e is not None]
        if reply.ok and failed:
            reply = failed[0].to(call.id)
    log.info("op %s done in %.2fs ok=%s", op, time.perf_counter() - t0, reply.ok)
    return reply


def serve(worker: Handles | None, conn: Connection | None, cfg: TrainerConfig) -> None:
    """The request loop, on every rank, until :class:`Shutdown` (or the orchestrator's connection closes)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    while True:
        msg: Incoming | None = None
        if rank == 0:
            assert conn is not None
            msg = _next_request(conn, cfg.heartbeat_s)
        if world > 1:
            box: list[Incoming | None] = [msg]
            dist.broadcast_object_list(box, src=0)
            msg = box[0]
        assert msg is not None
        if isinstance(msg, Heartbeat):
            continue
        if isinstance(msg, PeerGone):
            return
        if isinstance(msg, Invalid):
            reply = Reply(msg.id, ok=False, error=f"ValueError: malformed request {msg.payload}")
        elif isinstance(msg.request, Shutdown):
            reply = Reply(msg.id, ok=True)
        else:
            reply = _run_call(worker, msg, world)
        if conn is not None:  # rank 0
            try:
                conn.send(reply)
            except (OSError, ValueError) as exc:
                log.warning("could not reply to the orchestrator (%s)", exc)
        if isinstance(msg, Call) and isinstance(msg.request, Shutdown):
            return


def _connect() -> Connection:
    host, port = os.environ["AGENTRL_TRAINER_ADDR"].rsplit(":", 1)
    authkey = bytes.fromhex(os.environ["AGENTRL_TRAINER_AUTHKEY"])
    return Client((host, int(port)), authkey=authkey)


def main(argv: list[str] | None = None) -> int:
    """Entry point of every torchrun rank."""
    parser = argparse.ArgumentParser(prog="agentrl.trainer.worker")
    parser.add_argument("--config", required=True, help="path of the TrainerConfig JSON")
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=logging.INFO, stream=sys.stdout, format=f"%(asctime)s [rank{rank}] %(levelname)s %(message)s"
    )
    cfg = TrainerConfig.model_validate_json(Path(args.config).read_text())
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    timeout = datetime.timedelta(seconds=cfg.collective_timeout_s)
    if use_cuda:
        model_io.resolve_device(cfg, int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timeout)
    conn = _connect() if rank == 0 else None
    worker: Worker | None
    try:
        worker = Worker(cfg)
        ready = Reply(None, ok=True, result={"ready": True, **worker.info()})
    except Exception as exc:
        log.exception("trainer initialisation failed")
        ready = dataclasses.replace(_error(exc), result={"ready": False})
        worker = None
    if conn is not None:
        conn.send(ready)
    if worker is None:
        return 1
    log.info("ready: %s", worker.info())
    try:
        serve(worker, conn, cfg)
    finally:
        if conn is not None:
            conn.close()
        dist.destroy_process_group()
        log.info("process group destroyed; exiting")
    return 0


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's finalisation: it destroys C++ objects of torch's libraries whose threads
    # may still run, which std::terminate()s the process (SIGABRT after "process group destroyed", seen on a
    # loaded machine), turning a clean stop into a failed rank. Everything of ours is closed by now.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
