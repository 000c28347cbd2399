"""Placement: which device every process of a run gets, decided once, before anything starts.

A run starts at most two kinds of local process: vLLM servers (``inference.tensor_parallel_size`` GPUs each)
and one ``torchrun`` trainer job (one rank per GPU). The planner turns ``[placement]`` (or
``--inference-gpus 0-3 --trainer-gpus 4-7``) and the visible GPUs into a :class:`Plan`: one entry per
process, with its ``CUDA_VISIBLE_DEVICES``, tensor-parallel size, memory share and port. An impossible
plan (a device that does not exist, a server that would get half its tensor-parallel group, a GPU given to
both sides with vLLM's default 0.85 memory share, ...) raises :class:`PlacementError` naming the flag to
change, before any process starts. ``agentrl train --dry-run`` prints the plan and exits.

Pure Python (no torch, no vLLM): the run config imports :class:`PlacementConfig`, and the planner is
unit-tested on machines without GPUs. GPU ids in the flags are indices into the GPUs this process sees
(as in torch: after the parent's own ``CUDA_VISIBLE_DEVICES``); the plan maps them back to what each child
must be given.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

from agentrl.config.placement import _LIST, PlacementConfig
from agentrl.core.errors import ConfigError
from agentrl.launch.memory import read_shape, trainer_memory_note

SHARED_GPU_MAX_UTILIZATION = 0.5
"""Highest vLLM memory share on a GPU that the trainer also uses: the trainer needs the rest."""
SHARED_GPU_AUTO_UTILIZATION = 0.45
"""The memory share given to vLLM on a shared GPU when the user did not set one."""


class PlacementError(ConfigError, ValueError):
    """The devices asked for cannot host the run; the message names the setting to change."""

    code = "config.placement"


def parse_devices(spec: str) -> list[int]:
    """``"0-3,6"`` → ``[0, 1, 2, 3, 6]`` (order kept; a repeated device is an error)."""
    if not re.match(_LIST, spec):
        raise PlacementError(f"{spec!r} is not a device list such as '0-3' or '0,2,4'")
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        a, b = int(lo), int(hi or lo)
        if b < a:
            raise PlacementError(f"device range {part!r} runs backwards")
        out.extend(range(a, b + 1))
    dup = sorted({d for d in out if out.count(d) > 1})
    if dup:
        raise PlacementError(f"device list {spec!r} names GPU(s) {dup} more than once")
    return out


def format_devices(devices: list[int]) -> str:
    """``[0, 1, 2, 3, 6]`` → ``"0-3,6"``."""
    parts: list[str] = []
    i = 0
    while i < len(devices):
        j = i
        while j + 1 < len(devices) and devices[j + 1] == devices[j] + 1:
            j += 1
        parts.append(str(devices[i]) if i == j else f"{devices[i]}-{devices[j]}")
        i = j + 1
    return ",".join(parts)


def visible_gpus(environ: dict[str, str] | None = None) -> list[str]:
    """The GPUs this process may use, as the ids its children's ``CUDA_VISIBLE_DEVICES`` must name.

    ``CUDA_VISIBLE_DEVICES`` when set (ids or UUIDs; empty: none), else one entry per GPU that
    ``nvidia-smi -L`` lists, else none. Never imports torch.
    """
    environ = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in environ:
        return [d.strip() for d in environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip() and d.strip() != "-1"]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=15, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    # one line per GPU ("GPU 0: ..."); MIG devices are indented lines under their GPU
    return [str(i) for i, _ in enumerate(ln for ln in out.splitlines() if ln.startswith("GPU "))]


@dataclass
class ProcessPlan:
    """One process of the run, and where it goes."""

    role: str
    """``vllm`` or ``trainer``."""
    name: str
    """``vllm-0``, ``vllm-1``, ..., ``trainer``."""
    devices: list[int]
    """GPU indices (as seen by this process); empty: CPU."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment the process is started with (``CUDA_VISIBLE_DEVICES``)."""
    port: int | None = None
    """TCP port; None: a free one, picked at start."""
    tensor_parallel_size: int = 1
    """vLLM only: GPUs per engine."""
    gpu_memory_utilization: float | None = None
    """vLLM on GPU only: its memory share of each device."""
    nproc: int = 1
    """trainer only: torchrun ranks on this node."""
    cpu_cores: str | None = None
    """CPU pinning (``taskset`` list), if any."""

    def where(self) -> str:
        """Devices in words: ``GPU 0-3``, ``CPU cores 1`` or ``CPU``."""
        if self.devices:
            return f"GPU {format_devices(self.devices)}"
        return f"CPU cores {self.cpu_cores}" if self.cpu_cores else "CPU"


@dataclass
class Plan:
    """Every process a run starts, plus the inference endpoints it only connects to."""

    processes: list[ProcessPlan]
    endpoints: list[str]
    gpus_visible: int
    notes: list[str] = field(default_factory=list)

    @property
    def servers(self) -> list[ProcessPlan]:
        """The local vLLM servers, in order."""
        return [p for p in self.processes if p.role == "vllm"]

    @property
    def trainer(self) -> ProcessPlan:
        """The trainer job."""
        return next(p for p in self.processes if p.role == "trainer")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "gpus_visible": self.gpus_visible,
            "endpoints": self.endpoints,
            "notes": self.notes,
            "processes": [
                {"role": p.role, "name": p.name, "devices": p.devices, "env": p.env, "port": p.port,
                 "tensor_parallel_size": p.tensor_parallel_size,
                 "gpu_memory_utilization": p.gpu_memory_utilization, "nproc": p.nproc, "cpu_cores": p.cpu_cores}
                for p in self.processes
            ],
        }

    def render(self) -> str:
        """The plan as a table for people."""
        rows = [("process", "where", "details", "port", "environment")]
        for p in self.processes:
            if p.role == "vllm":
                details = f"TP {p.tensor_parallel_size}"
                if p.gpu_memory_utilization is not None:
                    details += f", memory {p.gpu_memory_utilization:g}"
            else:
                details = f"{p.nproc} rank(s)"
            port = "free port at start" if p.port is None else str(p.port)
            if p.role == "trainer":
                port = "rendezvous on a free port"
            env = " ".join(f"{k}={v}" for k, v in p.env.items()) or "-"
            rows.append((p.name, p.where(), details, port, env))
        for url in self.endpoints:
            rows.append(("endpoint", url, "existing server (not started)", "-", "-"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [f"plan: {len(self.servers)} local vLLM server(s), {len(self.endpoints)} endpoint(s), trainer "
                 f"with {self.trainer.nproc} rank(s); {self.gpus_visible} GPU(s) visible"]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def plan_run(cfg: Any, gpus: list[str] | None = None) -> Plan:
    """The placement of ``cfg`` (a :class:`~agentrl.config.run.RunConfig`) on ``gpus`` (default: the visible
    ones, :func:`visible_gpus`). Raises :class:`PlacementError` for a plan that cannot work.

    Rules, in order:
    - ``endpoints`` set: no local server; every GPU may go to the trainer.
    - No GPU visible (or ``trainer.device = "cpu"`` and no server to place): CPU processes, pinned by the
      existing ``cpu_cores`` settings; GPU flags are refused.
    - Both lists given: used as given. One given: the other side gets every remaining GPU.
      None given: one GPU is shared by both sides; two or more are split in two, the servers taking
      ``max(TP, half rounded down to a multiple of TP)`` of them.
    - A GPU on both sides caps vLLM's memory share at 0.5 (set to 0.45 when left at its default).
    """
    gpus = visible_gpus() if gpus is None else gpus
    if not gpus:
        _check_cpu_only(cfg)
        return _cpu_plan(cfg, [])
    inf_dev, trn_dev = _devices(cfg, len(gpus))
    nproc = _trainer_ranks(cfg, trn_dev)
    notes: list[str] = []
    util = _memory_share(cfg.inference, sorted(set(inf_dev) & set(trn_dev)), notes)
    procs = [*_server_processes(cfg.inference, gpus, inf_dev, util), _trainer_process(cfg, gpus, trn_dev, nproc)]
    return Plan(processes=procs, endpoints=list(cfg.endpoints), gpus_visible=len(gpus),
                notes=notes + _node_notes(cfg) + _memory_notes(cfg, nproc))


def _check_cpu_only(cfg: Any) -> None:
    """No GPU is visible: refuse the settings that ask for one."""
    pc = cfg.placement
    asked = [flag for flag, v in (("--inference-gpus", pc.inference_gpus), ("--trainer-gpus", pc.trainer_gpus)) if v]
    if asked:
        raise PlacementError(f"{' and '.join(asked)} given, but no GPU is visible (CUDA_VISIBLE_DEVICES / "
                             "nvidia-smi); leave them out to run on the CPU")
    if cfg.trainer.device == "cuda":
        raise PlacementError("trainer.device = 'cuda', but no GPU is visible; use 'auto' or 'cpu'")


def _devices(cfg: Any, n: int) -> tuple[list[int], list[int]]:
    """The GPUs (indexes of the ``n`` visible ones) of the local vLLM servers and of the trainer: the flags'
    lists as given, the other side's by :func:`plan_run`'s rules."""
    pc: PlacementConfig = cfg.placement
    tp = cfg.inference.tensor_parallel_size
    local_servers = not cfg.endpoints
    trainer_on_gpu = cfg.trainer.device != "cpu"
    if not local_servers and pc.inference_gpus:
        raise PlacementError("--inference-gpus places local vLLM servers, but --endpoint servers are used and "
                             "none is started; leave one of them out")
    inf_dev = _checked(pc.inference_gpus, n, "--inference-gpus") if local_servers else []
    trn_dev = _checked(pc.trainer_gpus, n, "--trainer-gpus")
    if not trainer_on_gpu and trn_dev:
        raise PlacementError("--trainer-gpus given, but trainer.device = 'cpu'")
    if local_servers and pc.inference_gpus is None:
        inf_dev = _default_inference_devices(pc, n, tp, trn_dev, trainer_on_gpu)
    if trainer_on_gpu and pc.trainer_gpus is None:
        trn_dev = [d for d in range(n) if d not in inf_dev] or list(range(n))
    if len(inf_dev) % tp:
        raise PlacementError(f"--inference-gpus {format_devices(inf_dev)} is {len(inf_dev)} GPU(s), not a multiple "
                             f"of the tensor-parallel size {tp}: each vLLM server takes {tp}")
    return inf_dev, trn_dev


def _default_inference_devices(pc: PlacementConfig, n: int, tp: int, trn_dev: list[int],
                               trainer_on_gpu: bool) -> list[int]:
    """The servers' GPUs when ``--inference-gpus`` is not given: what the trainer's leave (a multiple of the
    tensor-parallel size), half of them when the trainer is on GPUs too, else the first ``tp``."""
    if pc.trainer_gpus is not None:
        inf_dev = [d for d in range(n) if d not in trn_dev][: _fit(n - len(trn_dev), tp)]
        if not inf_dev:
            raise PlacementError(f"--trainer-gpus {pc.trainer_gpus} leaves no GPU for the vLLM server "
                                 f"(tensor-parallel size {tp}); give --inference-gpus")
        return inf_dev
    if trainer_on_gpu and n >= 2:
        inf_dev = list(range(max(tp, _fit(n // 2, tp))))
        if len(inf_dev) > n:
            raise PlacementError(f"tensor-parallel size {tp} needs {tp} GPUs, only {n} visible")
        return inf_dev
    if tp > n:
        raise PlacementError(f"tensor-parallel size {tp} needs {tp} GPUs, only {n} visible")
    return list(range(tp))


def _trainer_ranks(cfg: Any, trn_dev: list[int]) -> int:
    """The trainer's ranks: one per trainer GPU (an ``--nproc`` that says otherwise is refused), else ``nproc``."""
    if not trn_dev:
        return cfg.nproc
    if "nproc" in cfg.model_fields_set and cfg.nproc != len(trn_dev):
        raise PlacementError(f"--nproc {cfg.nproc} contradicts the {len(trn_dev)} trainer GPU(s) "
                             f"{format_devices(trn_dev)}: the trainer runs one rank per GPU")
    return len(trn_dev)


def _memory_share(inf: Any, shared: list[int], notes: list[str]) -> float:
    """vLLM's memory share: as set, but capped where GPUs (``shared``) host both vLLM and the trainer (set to
    the shared default when left out, with a note)."""
    util = inf.gpu_memory_utilization
    if not shared:
        return util
    if "gpu_memory_utilization" not in inf.model_fields_set:
        notes.append(f"GPU(s) {format_devices(shared)} are shared by vLLM and the trainer: vLLM's memory "
                     f"share is set to {SHARED_GPU_AUTO_UTILIZATION:g} (inference.gpu_memory_utilization)")
        return SHARED_GPU_AUTO_UTILIZATION
    if util > SHARED_GPU_MAX_UTILIZATION:
        raise PlacementError(
            f"GPU(s) {format_devices(shared)} host both vLLM and the trainer, but "
            f"inference.gpu_memory_utilization = {util:g} leaves the trainer too little memory; set it "
            f"to at most {SHARED_GPU_MAX_UTILIZATION} or give the two sides separate GPUs "
            "(--inference-gpus / --trainer-gpus)")
    return util


def _server_processes(inf: Any, gpus: list[str], inf_dev: list[int], util: float) -> list[ProcessPlan]:
    """One vLLM server per ``tensor_parallel_size`` GPUs of ``inf_dev``."""
    tp = inf.tensor_parallel_size
    return [ProcessPlan(role="vllm", name=f"vllm-{i // tp}", devices=inf_dev[i : i + tp],
                        env={"CUDA_VISIBLE_DEVICES": ",".join(gpus[d] for d in inf_dev[i : i + tp])},
                        port=(inf.port + i // tp) if inf.port else None, tensor_parallel_size=tp,
                        gpu_memory_utilization=util)
            for i in range(0, len(inf_dev), tp)]


def _trainer_process(cfg: Any, gpus: list[str], trn_dev: list[int], nproc: int) -> ProcessPlan:
    """The trainer job on ``trn_dev`` (none: the CPU)."""
    return ProcessPlan(role="trainer", name="trainer", devices=trn_dev, nproc=nproc,
                       env={"CUDA_VISIBLE_DEVICES": ",".join(gpus[d] for d in trn_dev)} if trn_dev else {},
                       cpu_cores=cfg.trainer.cpu_cores)


def _node_notes(cfg: Any) -> list[str]:
    d = cfg.trainer.distributed
    if d.nnodes == 1:
        return []
    return [f"the trainer spans {d.nnodes} nodes (c10d rendezvous at {d.master_addr}:{d.master_port}); this "
            f"machine runs one of them: start `agentrl trainer-node --join <run dir>/trainer_join.json` on "
            f"each of the other {d.nnodes - 1}"]


def _memory_notes(cfg: Any, nproc: int) -> list[str]:
    """The trainer's estimated memory per rank (``nproc`` ranks on each node), when the model's
    ``config.json`` can be read here (see :mod:`agentrl.launch.memory`)."""
    shape = read_shape(cfg.model)
    if shape is None:
        return []
    return [trainer_memory_note(shape, cfg.trainer, nproc * cfg.trainer.distributed.nnodes)]


def _checked(spec: str | None, n: int, flag: str) -> list[int]:
    if spec is None:
        return []
    devices = parse_devices(spec)
    missing = [d for d in devices if d >= n]
    if missing:
        raise PlacementError(f"{flag} {spec} names GPU(s) {missing}, but only {n} are visible "
                             f"(0-{n - 1})")
    return devices


def _fit(count: int, tp: int) -> int:
    """``count`` rounded down to a multiple of ``tp``."""
    return count - count % tp


def _cpu_plan(cfg: Any, notes: list[str]) -> Plan:
    inf = cfg.inference
    procs: list[ProcessPlan] = []
    if not cfg.endpoints:
        procs.append(ProcessPlan(role="vllm", name="vllm-0", devices=[], port=inf.port or None,
                                 tensor_parallel_size=inf.tensor_parallel_size, cpu_cores=inf.cpu_cores))
    procs.append(ProcessPlan(role="trainer", name="trainer", devices=[], nproc=cfg.nproc,
                             cpu_cores=cfg.trainer.cpu_cores))
    if not cfg.endpoints and not (inf.cpu_cores or cfg.trainer.cpu_cores):
        notes.append("no GPU: the vLLM server and the trainer share the CPU cores (pin them apart with "
                     "inference.cpu_cores / trainer.cpu_cores)")
    return Plan(processes=procs, endpoints=list(cfg.endpoints), gpus_visible=0,
                notes=notes + _node_notes(cfg) + _memory_notes(cfg, cfg.nproc))
