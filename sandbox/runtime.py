"""OCI runtimes other than runc (gVisor's ``runsc``): what the engine offers, host pids budgets, and the
removal of runtime processes that a failed start left behind.

gVisor runs a user-space kernel (the Sentry) per container. On its default ``ptrace`` platform the Sentry's
own threads and one stub per guest process live in the container's pids cgroup: measured with runsc
20221219, an idle sandbox holds ~53 host pids and every guest process ~9 more (~15 during a fork bomb). A runc-sized pids limit
(128) makes the Sentry fail to create a thread after a handful of commands; it then panics ("error
initializing first thread: resource temporarily unavailable") and the container dies. So under runsc the
engine's pids limit is scaled (`host_pids_limit`), and the guest's processes are bounded inside gVisor by
``RLIMIT_NPROC`` (`guest_ulimits`). That stopped a plain fork bomb at 63 processes in some runs, but not
reliably: in others, and in the attack tests, the host threads still reached the scaled limit, the Sentry
died and the container with it (contained: nothing outside is affected, but the sandbox is lost).

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
"""Host pids an idle runsc sandbox needs (measured: 53), rounded up."""
RUNSC_PIDS_PER_PROCESS = 20
"""Host pids per guest process under runsc's ptrace platform (measured: ~9 for idle processes, ~15 at the
peak of a fork bomb held at 128 processes by ``RLIMIT_NPROC``), with room to spare."""


def host_pids_limit(runtime: str, pids_limit: int) -> int:
    """The engine's pids limit for a sandbox allowed ``pids_limit`` processes under ``runtime``."""
    if runtime == "runsc":
        return RUNSC_IDLE_PIDS + RUNSC_PIDS_PER_PROCESS * pids_limit
    return pids_limit


def guest_ulimits(runtime: str, pids_limit: int) -> list[dict[str, Any]]:
    """Extra ulimits for ``runtime``: under runsc, ``nproc = pids_limit``. gVisor counts processes per uid
    inside its own kernel, so the guest cannot hold more than ``pids_limit`` processes (measured: a fork
    bomb held at 63 with nproc 64; not always before the host limit, see the module docstring). Not under runc: there the count is per uid across the
    whole host, so other sandboxes' processes would count too."""
    if runtime == "runsc":
        return [{"name": "nproc", "soft": pids_limit, "hard": pids_limit}]
    return []


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
