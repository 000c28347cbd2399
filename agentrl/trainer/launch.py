"""Launching the trainer's ranks: the ``torchrun`` command, its environment, and joining a run from another node."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import agentrl
from agentrl.config.trainer import DistributedConfig, TrainerConfig
from agentrl.core.utils.lifeline import own_process, release_process
from agentrl.core.utils.threads import short_spin

JOIN_FILE = "trainer_join.json"
"""Written into the run directory when the trainer spans several nodes: what ``agentrl trainer-node``
needs on every other node (the trainer config, the rendezvous, the orchestrator's address and the key
rank 0 authenticates with; readable by its owner only)."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_node(join: dict[str, Any], work_dir: Path, nproc: int | None = None, local_addr: str | None = None) -> int:
    """Run one more node of a multi-node trainer from its join file's contents (``agentrl trainer-node``):
    torchrun in its own process group, in the foreground; returns its exit code. SIGTERM and SIGINT stop
    the group. ``local_addr``: the address the other nodes reach this one at (default: its host name)."""
    cfg = TrainerConfig.model_validate(join["trainer_config"])
    work_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = work_dir / "trainer_config.json"
    cfg_path.write_text(cfg.model_dump_json(indent=2))
    cmd = torchrun_command(cfg_path, nproc or int(join["nproc_per_node"]), cfg.distributed,
                           int(join["master_port"]), str(join["rdzv_id"]), hosts_rendezvous=False,
                           local_addr=local_addr)
    env = worker_env(str(join["orchestrator"]), bytes.fromhex(join["authkey"]))
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    own_process(proc.pid)  # torchrun and its ranks end with this node's agentrl process, however it dies

    def stop(signum: int, _frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return proc.wait()
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        release_process(proc.pid)


def count_cores(cores: str) -> int:
    """Cores in a ``taskset`` list: ``"0-3,6"`` → 5."""
    n = 0
    for part in cores.split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


def torchrun_command(cfg_path: Path, nproc: int, dist: DistributedConfig, master_port: int, rdzv_id: str,
                     hosts_rendezvous: bool = True, local_addr: str | None = None) -> list[str]:
    """The ``torchrun`` command of one node: static rendezvous on one node, c10d across nodes.

    Across nodes, the orchestrator's node (``hosts_rendezvous``) hosts the rendezvous store and the nodes
    that join do not. torchrun would otherwise decide by comparing ``master_addr`` with the addresses its
    host name resolves to, which misses an address of another interface (a cluster network, a second
    NIC): then no node hosts the store and every node fails to connect to it. ``local_addr`` is the address
    the other nodes reach this node at (torchrun's ``--local-addr``; default: ``master_addr`` on the
    orchestrator's node, the host name elsewhere): rank 0's node serves the workers' store there."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(dist.nnodes),
           "--nproc_per_node", str(nproc), "--monitor-interval", "0.5"]
    if dist.nnodes == 1:
        cmd += ["--master_addr", dist.master_addr, "--master_port", str(master_port)]
    else:
        cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{dist.master_addr}:{master_port}",
                "--rdzv-id", rdzv_id,
                "--rdzv-conf", f"join_timeout={int(dist.rdzv_timeout_s)},is_host={str(hosts_rendezvous).lower()}"]
        local_addr = local_addr or (dist.master_addr if hosts_rendezvous else None)
        if local_addr:
            cmd += ["--local-addr", local_addr]
    return [*cmd, "-m", "agentrl.trainer.worker", "--config", str(cfg_path)]


def worker_env(orchestrator: str, authkey: bytes, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a node's workers: rank 0 connects to ``orchestrator`` (``host:port``) with
    ``authkey``; agentrl importable from this checkout."""
    repo_root = str(Path(agentrl.__file__).resolve().parent.parent)
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, env.get("PYTHONPATH", "")) if p)
    env["AGENTRL_TRAINER_ADDR"] = orchestrator
    env["AGENTRL_TRAINER_AUTHKEY"] = authkey.hex()
    env.setdefault("PYTHONUNBUFFERED", "1")
    short_spin(env)  # the ranks often share their cores with an engine
    return env
