"""Orchestrator side of the trainer: launch ``torchrun`` workers and talk to rank 0 (the messages:
:mod:`agentrl.trainer.messages`)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any

import torch

from agentrl.config.trainer import TrainerConfig
from agentrl.core.errors import AgentRLError
from agentrl.core.types import TrainSample
from agentrl.core.utils.lifeline import own_process, release_process
from agentrl.trainer.launch import JOIN_FILE, _free_port, count_cores, torchrun_command, worker_env
from agentrl.trainer.messages import (
    Call,
    GetAdapterTensors,
    LoadCheckpoint,
    Logprobs,
    NcclSendWeights,
    Reply,
    Request,
    SaveAdapter,
    SaveCheckpoint,
    Shutdown,
    Train,
    WeightSpecs,
    WriteAdapter,
    WriteWeightBucket,
    op_name,
)


class TrainerError(AgentRLError, RuntimeError):
    """The trainer failed: an op raised remotely, the process died, or a wait timed out."""

    code = "trainer"

    def __init__(self, message: str, remote_traceback: str = "") -> None:
        super().__init__(message)
        self.remote_traceback = remote_traceback


class TrainerProcess:
    """A ``torchrun`` trainer job and the connection to its rank 0.

    ``start``, ``close`` and ``request`` (one :class:`~agentrl.trainer.messages.Request`, answered by a
    :class:`~agentrl.trainer.messages.Reply`) block, each wait bounded by a timeout; the ops (``train``,
    ``logprobs``, ``save_adapter``, ``get_adapter_tensors``, ``save_checkpoint``, ``load_checkpoint``, ...) are
    coroutines that run one ``request`` in a thread. Requests are serialised (one in flight at a time).
    """

    def __init__(
        self,
        cfg: TrainerConfig,
        run_dir: Path,
        nproc: int = 1,
        *,
        connect_timeout_s: float = 120.0,
        ready_timeout_s: float = 1800.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.nproc = nproc
        self.connect_timeout_s = connect_timeout_s
        self.ready_timeout_s = ready_timeout_s
        self.extra_env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: dict[str, Any] = {}
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.log_path = self.run_dir / "trainer.log"
        self.join_path: Path | None = None
        """The join file of a multi-node trainer (None on one node)."""

    # ----------------------------------------------------------------- lifecycle
    @property
    def alive(self) -> bool:
        """Whether the torchrun process is still running."""
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 30) -> str:
        """The last ``n`` lines of ``trainer.log``."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no trainer.log)"
        return "\n".join(lines[-n:])

    def _fail(self, what: str) -> TrainerError:
        code = None if self.proc is None else self.proc.poll()
        return TrainerError(f"{what} (exit code {code}); last lines of {self.log_path}:\n{self.log_tail()}")

    def start(self) -> dict[str, Any]:
        """Launch the workers and wait until rank 0 has connected and built the model; returns its info."""
        if self.proc is not None:
            raise TrainerError("trainer already started")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        authkey = os.urandom(16)
        dist = self.cfg.distributed
        listener = Listener((dist.orchestrator_addr, 0), authkey=authkey)
        host, port = listener.address
        cfg = self.cfg
        if Path(cfg.model_path).exists():  # the workers must not depend on a relative path
            cfg = cfg.model_copy(update={"model_path": str(Path(cfg.model_path).resolve())})
        cfg_path = self.run_dir / "trainer_config.json"
        cfg_path.write_text(cfg.model_dump_json(indent=2))
        env = worker_env(f"{host}:{port}", authkey, self.extra_env)
        master_port = dist.master_port or _free_port()
        rdzv_id = f"agentrl-{os.getpid()}-{port}"
        cmd = torchrun_command(cfg_path, self.nproc, dist, master_port, rdzv_id)
        if dist.nnodes > 1:
            self.join_path = self.run_dir / JOIN_FILE
            fd = os.open(self.join_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"trainer_config": json.loads(cfg.model_dump_json()), "orchestrator": f"{host}:{port}",
                           "authkey": authkey.hex(), "nproc_per_node": self.nproc, "master_port": master_port,
                           "rdzv_id": rdzv_id}, f)
        if cfg.cpu_cores:  # taskset execs torchrun (same pid); its workers inherit the affinity
            cmd = ["taskset", "-c", cfg.cpu_cores, *cmd]
            env["OMP_NUM_THREADS"] = str(max(1, count_cores(cfg.cpu_cores) // self.nproc))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True,
            )  # fmt: skip
        own_process(self.proc.pid)  # torchrun and its ranks end with this process, however it dies
        (self.run_dir / "trainer.pid").write_text(f"{self.proc.pid}\n")
        try:
            self._conn = self._accept(listener, (host, port), authkey)
            hello = self._recv(self.ready_timeout_s, "waiting for the trainer to load the model")
        except BaseException:
            self._kill()
            raise
        finally:
            listener.close()
        if not hello.ok:
            self._kill()
            raise TrainerError(f"trainer initialisation failed: {hello.error}", hello.traceback)
        self.info = {"ok": True, **hello.result}  # the worker's info, and ``ready``
        return self.info

    def _accept(self, listener: Listener, address: tuple[str, int], authkey: bytes) -> Connection:
        """``listener.accept()`` bounded by ``connect_timeout_s`` and by the process staying alive."""
        box: dict[str, Any] = {}

        def accept() -> None:
            try:
                box["conn"] = listener.accept()
            except Exception as exc:
                box["error"] = exc

        thread = threading.Thread(target=accept, name="trainer-accept", daemon=True)
        thread.start()
        deadline = time.monotonic() + self.connect_timeout_s
        while thread.is_alive() and self.alive and time.monotonic() < deadline:
            thread.join(0.2)
        if "conn" in box:
            return box["conn"]
        if thread.is_alive():  # unblock accept() with a connection that fails authentication
            try:
                Client(address, authkey=os.urandom(16)).close()
            except Exception:
                pass
            thread.join(5.0)
            if "conn" in box:
                box["conn"].close()
        if "error" in box and self.alive:
            raise TrainerError(f"trainer connection failed: {box['error']!r}")
        what = "trainer exited before connecting" if not self.alive else "trainer did not connect in time"
        raise self._fail(f"{what} ({self.connect_timeout_s:.0f}s timeout)")

    def _recv(self, timeout_s: float, what: str) -> Reply:
        conn = self._conn  # close() may drop it from another thread: this wait then ends with an error
        if conn is None:
            raise self._fail(f"trainer connection closed while {what}")
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if conn.poll(0.5):
                    msg = conn.recv()
                    if not isinstance(msg, Reply):
                        raise self._fail(f"unexpected message from the trainer while {what}: {msg!r:.200}")
                    return msg
            except (EOFError, OSError) as exc:
                raise self._fail(f"trainer connection lost while {what} ({exc!r})") from exc
            if not self.alive:
                raise self._fail(f"trainer exited while {what}")
            if time.monotonic() > deadline:
                raise self._fail(f"timed out after {timeout_s:.0f}s {what}")

    def request(self, request: Request, timeout_s: float = 3600.0) -> Reply:
        """Send one request and wait for its reply; raises :class:`TrainerError` on a remote error (the
        message is the remote ``Type: message``, the remote traceback is ``remote_traceback``)."""
        op = op_name(request)
        with self._lock:
            if self._conn is None or not self.alive:
                raise self._fail(f"trainer not running (op {op!r})")
            req_id = next(self._ids)
            try:
                self._conn.send(Call(req_id, request))
            except (OSError, ValueError) as exc:
                raise self._fail(f"could not send op {op!r} ({exc!r})") from exc
            deadline = time.monotonic() + timeout_s
            while True:
                reply = self._recv(max(deadline - time.monotonic(), 0.0), f"running op {op!r}")
                if reply.id == req_id:
                    break  # replies to earlier, timed-out requests are dropped
        if not reply.ok:
            raise TrainerError(f"trainer op {op!r} failed: {reply.error}", reply.traceback)
        return reply

    def close(self, timeout_s: float = 30.0, busy_wait_s: float = 5.0) -> int | None:
        """Ask the workers to shut down; SIGTERM then SIGKILL the process group if they do not. While an op is
        in flight (a run interrupted during a training step: its thread holds the connection until the reply)
        the workers are not asked, which would wait for the whole op: the connection is closed, and the process
        group gets ``busy_wait_s`` to exit before it is stopped."""
        if self.proc is None:
            return None
        idle = self._lock.acquire(timeout=1.0)
        if idle:
            self._lock.release()
        if idle and self.alive and self._conn is not None:
            try:
                self.request(Shutdown(), timeout_s=timeout_s)
            except TrainerError:
                pass
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        try:
            self.proc.wait(timeout=timeout_s if idle else busy_wait_s)
        except subprocess.TimeoutExpired:
            self._kill()
        release_process(self.proc.pid)
        return self.proc.returncode

    def _kill(self) -> None:
        """SIGTERM, then SIGKILL, the trainer's process group (its own session)."""
        if self.proc is None:
            return
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
        release_process(self.proc.pid)

    def __enter__(self) -> TrainerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- ops (coroutines; requests run in a thread)
    async def arequest(self, request: Request, timeout_s: float = 3600.0) -> dict[str, Any]:
        """:meth:`request` in a thread; the reply's ``result``."""
        return (await asyncio.to_thread(self.request, request, timeout_s)).result

    async def train(self, samples: Sequence[TrainSample], policy_version: int,
                    timeout_s: float = 3600.0) -> dict[str, Any]:
        """One ``train`` request on a batch of policy ``policy_version`` (the orchestrator's version, which
        staleness is measured against): the metrics (loss, grad_norm, clip_frac, is_weight_mean, kl,
        num_tokens, optimizer_step, staleness, time_s, ...)."""
        return await self.arequest(Train(list(samples), int(policy_version)), timeout_s)

    async def logprobs(self, samples: Sequence[TrainSample], timeout_s: float = 3600.0) -> list[list[float]]:
        """The current policy's logprob of every token of every sample, at the sample's temperature
        (position 0: 0.0); no update."""
        return (await self.arequest(Logprobs(list(samples)), timeout_s))["logprobs"]

    async def save_adapter(self, path: str | Path, timeout_s: float = 600.0) -> dict[str, Any]:
        """Write the adapter (or full model) directory at ``path``; returns ``path`` and ``bytes``."""
        return await self.arequest(SaveAdapter(str(Path(path).resolve())), timeout_s)

    async def get_adapter_tensors(self, timeout_s: float = 600.0) -> dict[str, torch.Tensor]:
        """The trainable tensors (peft key names for LoRA) as CPU tensors."""
        from safetensors.torch import load

        return load((await self.arequest(GetAdapterTensors(), timeout_s))["data"])

    async def write_adapter(self, layout: list[Any], shm_name: str, segment_bytes: int, b_scale: float | None,
                            timeout_s: float = 600.0) -> dict[str, Any]:
        """Write the adapter into the shared-memory segment ``shm_name`` at the places of ``layout`` (B scaled by
        ``b_scale``), where the trainer can (one rank, a first gather made): ``written`` and ``write_ms``."""
        return await self.arequest(WriteAdapter(list(layout), shm_name, int(segment_bytes), b_scale), timeout_s)

    async def weight_specs(self, timeout_s: float = 600.0) -> list[tuple[str, list[int]]]:
        """Every parameter's name and full shape, in model order (full-weight sync plans its buckets on it)."""
        return [(str(n), list(s)) for n, s in (await self.arequest(WeightSpecs(), timeout_s))["specs"]]

    async def write_weight_bucket(self, layout: list[Any], shm_name: str | None, segment_bytes: int, offset: int,
                                  timeout_s: float = 600.0) -> dict[str, Any]:
        """Gather one bucket of full weights (cast to the layout's dtype) and write it at ``offset`` of the
        shared-memory segment ``shm_name``; ``written`` False (another host, or no segment) returns its bytes
        as ``data``. Also ``gather_ms`` and ``write_ms``."""
        return await self.arequest(WriteWeightBucket(layout, shm_name, segment_bytes, offset), timeout_s)

    async def nccl_send_weights(self, urls: list[str], master_address: str,
                                timeout_s: float = 1800.0) -> dict[str, Any]:
        """Broadcast the full weights into the engines ``urls`` through vLLM's NCCL weight-transfer engine
        (groups opened on the first call; ``master_address``: rank 0's address, reachable from the engines)."""
        return await self.arequest(NcclSendWeights(list(urls), master_address), timeout_s)

    async def save_checkpoint(self, path: str | Path, timeout_s: float = 1800.0) -> dict[str, Any]:
        """Sharded checkpoint of trainable params, optimizer, optimizer step and RNGs at ``path``."""
        return await self.arequest(SaveCheckpoint(str(Path(path).resolve())), timeout_s)

    async def load_checkpoint(self, path: str | Path, timeout_s: float = 1800.0) -> dict[str, Any]:
        """Restore a checkpoint written by :meth:`save_checkpoint` (any world size); returns its step."""
        return await self.arequest(LoadCheckpoint(str(Path(path).resolve())), timeout_s)

    async def aclose(self, timeout_s: float = 30.0) -> int | None:
        """:meth:`close` in a thread."""
        return await asyncio.to_thread(self.close, timeout_s)
