"""The trainer worker: ``torchrun --nproc_per_node N -m agentrl.trainer.worker --config cfg.json``.

Rank 0 connects to the orchestrator (``AGENTRL_TRAINER_ADDR`` = ``host:port``, ``AGENTRL_TRAINER_AUTHKEY``
= hex) and first sends ``{"ok": True, "ready": True, ...}`` once the model is built. Then, for every
pickled request ``{"op": ..., "id": ..., ...}`` it receives, it broadcasts the request to all ranks, every
rank runs the op, and rank 0 replies ``{"ok": True, "id": ..., ...}`` or ``{"ok": False, "id": ...,
"error": "Type: msg", "traceback": ...}``. Ops: ``train`` (``samples``, ``policy_version``), ``logprobs``
(``samples``: the current policy's per-token logprobs, no update), ``save_adapter``,
``get_adapter_tensors``, ``weight_specs`` and ``write_weight_bucket`` (full-weight sync, one bucket per call:
:mod:`agentrl.trainer.weights`), ``nccl_send_weights`` (full weights through vLLM's NCCL weight-transfer
engine: :mod:`agentrl.trainer.nccl_sync`), ``save_checkpoint``, ``load_checkpoint``, ``ping``, ``shutdown``. An op that raises on every rank (bad
arguments, a missing path) leaves the worker serving; a rank failing alone inside a collective is fatal.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import sys
import time
import traceback
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from agentrl.config.trainer import TrainerConfig
from agentrl.errors import AgentRLError
from agentrl.trainer import model as model_io
from agentrl.trainer.errors import TrainerSettingError
from agentrl.trainer.train_step import TrainStep
from agentrl.trainer.weights import BucketWriter, weight_specs

log = logging.getLogger("agentrl.trainer")


class UnknownOp(AgentRLError, ValueError):
    """The client asked rank 0 for an op the worker does not have."""

    code = "trainer.unknown_op"


class Worker:
    """One rank's model, optimizer and op handlers."""

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
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=cfg.lr, betas=cfg.betas, eps=cfg.adam_eps, weight_decay=cfg.weight_decay
        )
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

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        """Run one op on this rank; the returned dict is the reply (meaningful on rank 0)."""
        op = req.get("op")
        if op == "ping":
            return {"optimizer_step": self.step.optimizer_step}
        if op == "train":
            return self.step.train(req["samples"], int(req["policy_version"]))
        if op == "logprobs":
            return {"logprobs": self.step.score(req["samples"])}
        if op == "save_adapter":
            size = model_io.save_adapter(self.model, self.cfg, req["path"])
            return {"path": str(Path(req["path"]).resolve()), "bytes": size}
        if op == "get_adapter_tensors":
            from safetensors.torch import save

            tensors = model_io.gather_trainable(self.model, self.cfg)
            data = save(tensors) if self.rank == 0 else b""
            return {"format": "safetensors", "data": data}
        if op == "weight_specs":
            return {"specs": weight_specs(self.model)}
        if op == "write_weight_bucket":
            return self.buckets.write(self.model, req["layout"], req.get("shm_name"), int(req.get("segment_bytes", 0)),
                                      int(req.get("offset", 0)))
        if op == "nccl_send_weights":
            if self.nccl is None:
                from agentrl.trainer.nccl_sync import NcclSender

                self.nccl = NcclSender(self.model)
            return self.nccl.send(list(req["urls"]), str(req["master_address"]))
        if op == "save_checkpoint":
            model_io.save_checkpoint(self.model, self.optimizer, self.cfg, req["path"], self.step.optimizer_step)
            return {"path": str(req["path"]), "optimizer_step": self.step.optimizer_step}
        if op == "load_checkpoint":
            step = model_io.load_checkpoint(self.model, self.optimizer, self.cfg, req["path"])
            self.step.optimizer_step = step
            return {"path": str(req["path"]), "optimizer_step": step}
        raise UnknownOp(f"unknown op {op!r}")


def _error(exc: BaseException) -> dict[str, Any]:
    return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}


def _next_request(conn: Connection, heartbeat_s: float) -> dict[str, Any]:
    """Rank 0: the next request, a heartbeat after ``heartbeat_s`` idle, or shutdown if the peer left."""
    try:
        if not conn.poll(heartbeat_s):
            return {"op": "_heartbeat"}
        req = conn.recv()
    except (EOFError, OSError):
        log.warning("orchestrator connection closed: shutting down")
        return {"op": "shutdown", "id": None, "_peer_gone": True}
    if not isinstance(req, dict) or "op" not in req:
        return {"op": "_invalid", "id": None, "payload": repr(req)[:200]}
    return req


def serve(worker: Worker | None, conn: Connection | None, cfg: TrainerConfig) -> None:
    """The request loop, on every rank, until ``shutdown``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    while True:
        req = _next_request(conn, cfg.heartbeat_s) if rank == 0 else None
        if world > 1:
            box = [req]
            dist.broadcast_object_list(box, src=0)
            req = box[0]
        assert req is not None
        op = req["op"]
        if op == "_heartbeat":
            continue
        reply: dict[str, Any]
        if op == "shutdown":
            reply = {"ok": True}
        elif op == "_invalid":
            reply = {"ok": False, "error": f"ValueError: malformed request {req['payload']}", "traceback": ""}
        else:
            t0 = time.perf_counter()
            try:
                assert worker is not None
                reply = {"ok": True, **worker.handle(req)}
            except Exception as exc:
                log.exception("op %s failed", op)
                reply = _error(exc)
            if world > 1:
                errors: list[Any] = [None] * world
                dist.all_gather_object(errors, None if reply["ok"] else reply)
                failed = [e for e in errors if e is not None]
                if reply["ok"] and failed:
                    reply = failed[0]
            log.info("op %s done in %.2fs ok=%s", op, time.perf_counter() - t0, reply["ok"])
        if rank == 0 and not req.get("_peer_gone"):
            reply["id"] = req.get("id")
            try:
                conn.send(reply)
            except (OSError, ValueError) as exc:
                log.warning("could not reply to the orchestrator (%s)", exc)
        if op == "shutdown":
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
    try:
        worker = Worker(cfg)
        ready: dict[str, Any] = {"ok": True, "ready": True, **worker.info()}
    except Exception as exc:
        log.exception("trainer initialisation failed")
        ready = {**_error(exc), "ready": False}
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
