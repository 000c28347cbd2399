"""OCI runtimes other than runc (gVisor's ``runsc``): what the engine offers, the budgets gVisor needs, and the
removal of runtime processes that a failed start left behind.

gVisor runs a user-space kernel (the Sentry) per container. With runsc 20221219 on its ``ptrace`` platform
(the only one that starts here: ``--platform=kvm`` hangs), the Sentry, its gofer and one stub process per
guest address space live in the container's host cgroups, and two facts shape the limits:

* **Host threads.** Every Sentry thread that runs a guest process gets its own thread in that process's
  stub, so host threads grow far faster than guest processes: a fork bomb held at 128 guest processes by
  ``RLIMIT_NPROC`` peaked at 5,400 to 7,650 host pids (about 60 per guest process; ~1,300 of them stub
  threads at 1,500), while an idle sandbox holds ~60; on a loaded host (load average 20 on 2 CPUs) a bomb
  held at 48 went past 64 + 80 per process. The growth is in fact quadratic: a stub may get one thread per
  Sentry thread, and the Sentry runs about one thread per running guest process plus its own. When the host
  pids limit refuses a thread, or the threads' kernel memory fills the memory cgroup, the Sentry dies and
  the sandbox with it. So the guest is bounded inside gVisor (``nproc = pids_limit``, `guest_ulimits`), the
  host limit is that structural bound (`host_pids_limit`: 24,640 for 128), and the headroom must hold the
  Sentry's cost of a full process table (`RUNSC_MB_PER_PROCESS`; measured 126 MiB at 64 processes, 210 MiB
  at 128, idle 26 MiB); the memory limit, not the pids limit, is what bounds the host threads.
* **The host OOM killer ends the sandbox.** Guest memory is one memory file of the Sentry's; at the memory
  cgroup's limit the host OOM killer picks the stub with the most of it mapped, and gVisor's ptrace platform
  then kills the whole Sentry on purpose (a stub killed by SIGKILL is treated as fatal). gVisor has no
  memory limit of its own (its cgroupfs only reports usage), but it enforces ``RLIMIT_AS``: so under runsc
  every command runs with an address-space limit of ``headroom_mb`` (`process_mem_limit_mb`), and
  ``workspace_mb + tmp_mb + headroom_mb + RUNSC_SENTRY_MB <= mem_mb`` keeps one full-sized process, full
  disks and the Sentry inside the cgroup. A process over it gets ENOMEM ("MemoryError", "Cannot allocate
  memory") and the sandbox lives on. Several processes that together exceed ``mem_mb`` still end it.

A runsc start that hangs or is interrupted was seen leaving its ``runsc-sandbox`` and ``runsc-gofer``
processes alive (re-parented to init) after the container was removed. `reap_runtime_leftovers` kills
those, found by the container id in their arguments (only on the engine's own host).
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

log = logging.getLogger("agentrl.sandbox")

RUNSC_IDLE_PIDS = 64
"""Host pids an idle runsc sandbox needs (measured: 53 to 61), rounded up."""
RUNSC_SENTRY_THREADS = 64
"""Sentry threads beyond one per running guest process, for the host pids budget (`host_pids_limit`)."""
RUNSC_SENTRY_MB = 64
"""Memory the Sentry and gofer of a runsc sandbox keep for themselves, MiB (measured: 26 idle)."""
RUNSC_MB_PER_PROCESS = 2
"""Memory per guest process of a full process table under runsc, MiB: stub threads' kernel memory plus the
guest's own pages (measured: 126 MiB at 64 processes, 210 MiB at 128)."""


def host_pids_limit(runtime: str, pids_limit: int) -> int:
    """The engine's pids limit for a sandbox allowed ``pids_limit`` processes under ``runtime``."""
    if runtime == "runsc":  # each guest process's stub may get one thread per Sentry thread
        return RUNSC_IDLE_PIDS + pids_limit * (pids_limit + RUNSC_SENTRY_THREADS)
    return pids_limit


def guest_ulimits(runtime: str, pids_limit: int) -> list[dict[str, Any]]:
    """Extra ulimits for ``runtime``: under runsc, ``nproc = pids_limit``. gVisor counts processes per uid
    inside its own kernel, so the guest cannot hold more than ``pids_limit`` processes. Not under runc: there
    the count is per uid across the whole host, so other sandboxes' processes would count too."""
    if runtime == "runsc":
        return [{"name": "nproc", "soft": pids_limit, "hard": pids_limit}]
    return []


def process_mem_limit_mb(runtime: str, headroom_mb: int) -> int | None:
    """The address-space limit of each command's processes, MiB: ``headroom_mb`` under runsc (a process over
    it gets ENOMEM instead of a host OOM kill, which would end the whole gVisor sandbox); None under runc,
    whose OOM killer takes the process alone."""
    return headroom_mb if runtime == "runsc" else None


def runsc_budget_error(workspace_mb: int, tmp_mb: int, headroom_mb: int, mem_mb: int, pids_limit: int) -> str:
    """Why these limits cannot hold under runsc ("" when they can)."""
    need = workspace_mb + tmp_mb + headroom_mb + RUNSC_SENTRY_MB
    if need > mem_mb:
        return (f"under runsc, workspace_mb ({workspace_mb}) + tmp_mb ({tmp_mb}) + headroom_mb ({headroom_mb}) + "
                f"{RUNSC_SENTRY_MB} MiB for gVisor's Sentry = {need} MiB does not fit in mem_mb ({mem_mb}): a host "
                f"OOM kill ends the whole gVisor sandbox. Raise mem_mb to {need} or lower the sizes.")
    table = RUNSC_MB_PER_PROCESS * pids_limit
    if table > headroom_mb:
        return (f"under runsc, a full process table (pids_limit {pids_limit} x {RUNSC_MB_PER_PROCESS} MiB of "
                f"gVisor's host threads and pages = {table} MiB) does not fit in headroom_mb ({headroom_mb}): a fork "
                f"bomb would end the sandbox. Raise headroom_mb to {table} or lower pids_limit to "
                f"{headroom_mb // RUNSC_MB_PER_PROCESS}.")
    return ""


def engine_runtimes(client: Any) -> set[str]:
    """Names of the runtimes the engine has registered (``docker info``)."""
    return set((client.info().get("Runtimes") or {}).keys())


def runtime_pids(container_id: str, proc: Path = Path("/proc")) -> list[int]:
    """Processes of an OCI runtime (``runsc*``, ``containerd-shim*``) whose arguments name ``container_id``
    (a full 64-hex id, so no other container can match)."""
    if len(container_id) != 64:
        return []
    found: list[int] = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        name = os.path.basename(argv[0].decode(errors="replace")) if argv else ""
        if name.startswith(("runsc", "containerd-shim")) and any(container_id.encode() in a for a in argv[1:]):
            found.append(int(entry.name))
    return sorted(found)


def reap_runtime_leftovers(container_id: str) -> list[int]:
    """SIGKILL the runtime processes still naming ``container_id`` (after its removal); returns their pids.
    A no-op where the engine runs on another host (its processes are not visible here)."""
    pids = runtime_pids(container_id)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError) as e:
            log.warning("could not stop runtime process %d of %s: %s", pid, container_id[:12], e)
    if pids:
        log.warning("killed %d runtime process(es) left by the failed start of %s: %s", len(pids),
                    container_id[:12], pids)
    return pids
