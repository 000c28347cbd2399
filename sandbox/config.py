"""Sandbox configuration and results. Every default is the safe one: no configuration means no network,
a read-only root, no capabilities, bounded processes/memory/CPU/output, and a container that dies by itself."""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentrl.core.errors import ConfigError

from ._engine import SandboxError
from .runtime import runsc_budget_error

_OWNER: str | None = None


class SandboxConfigError(SandboxError, ConfigError, ValueError):
    """A sandbox or pool setting cannot be used (in a :class:`SandboxConfig`, pydantic reports it as a
    validation error); the message says what to change."""

    code = "sandbox.config"


def default_owner() -> str:
    """The run id used for the ``agentrl.owner`` label: ``$AGENTRL_RUN_ID`` or one id per process."""
    global _OWNER
    if _OWNER is None:
        _OWNER = os.environ.get("AGENTRL_RUN_ID") or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
    return _OWNER


class SandboxConfig(BaseModel):
    """How a :class:`~agentrl.sandbox.DockerSandbox` container is created and bounded."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    image: str = ""
    """Image to run; "" means the offline-built ``agentrl-sandbox:<recipe hash>`` (built on first use).
    Any image works if it has ``sh``, ``timeout`` (coreutils), ``kill`` and ``head``."""
    docker_host: str | None = None
    """Engine address (e.g. ``unix:///run/agentrl-docker.sock``); None means ``$DOCKER_HOST`` or the default socket."""
    owner: str = ""
    """Run id written to the ``agentrl.owner`` label (for cleanup); "" means ``$AGENTRL_RUN_ID`` or a per-process id."""
    runtime: str = Field("runc", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """OCI runtime of the container, as registered with the engine: ``runc`` (the default, a shared kernel) or
    ``runsc`` (gVisor: the container's system calls go to a user-space kernel). ``sandbox/provision.sh``
    installs ``runsc`` and registers it (with ``--network=none``)."""
    network_mode: str = "none"
    """Docker network mode. "none" gives the container a loopback interface only: no egress, no DNS, no host access."""
    read_only_root: bool = True
    """Mount the image's root filesystem read-only; only the workspace and /tmp are writable."""
    workspace: str = Field("/workspace", pattern=r"^/[A-Za-z0-9._/-]*$")
    """Absolute path of the writable workspace (a size-capped tmpfs volume, also the default working directory)."""
    workspace_mb: int = Field(512, ge=1, le=65536)
    """Size cap of the workspace tmpfs, MiB (its pages count against ``mem_mb``)."""
    tmp_mb: int = Field(128, ge=1, le=65536)
    """Size cap of the /tmp tmpfs, MiB (its pages count against ``mem_mb``)."""
    headroom_mb: int = Field(256, ge=16, le=1048576)
    """Memory kept for processes when both tmpfs are full: ``workspace_mb + tmp_mb + headroom_mb`` must fit in
    ``mem_mb``, so that filling the disk gives "No space left on device" instead of an OOM kill of the
    sandbox itself. Under ``runsc`` it is also each process's address-space limit (a bigger allocation gets
    ENOMEM), it must hold a full process table (2 MiB per ``pids_limit``), and 64 MiB more must fit in
    ``mem_mb`` for gVisor's Sentry (see `agentrl.sandbox.runtime`)."""
    user: str = Field("1000:1000", pattern=r"^\d+:\d+$")
    """``uid:gid`` that commands run as (the image's ``agent`` user). Root (uid 0) is refused."""
    keeper_user: str = Field("1001:1001", pattern=r"^\d+:\d+$")
    """``uid:gid`` of the container's init and lifetime timer; different from ``user`` so sandboxed code cannot
    kill them and the post-timeout reaper (``kill -9 -1`` as ``user``) spares them."""
    pids_limit: int = Field(128, ge=16, le=32768)
    """Maximum number of processes/threads in the container (fork bombs stop here). Under ``runsc`` the
    engine's limit is scaled to leave room for gVisor's own host threads (see `agentrl.sandbox.runtime`)."""
    mem_mb: int = Field(1024, ge=32, le=1048576)
    """Memory limit, MiB, tmpfs pages included; swap is disabled (memswap = memory), so exceeding it
    OOM-kills inside the container (reported in ``ExecResult.oom_killed`` and the output)."""
    cpus: float = Field(1.0, gt=0.01, le=256)
    """CPU quota in CPUs (CFS quota, ``nano_cpus``)."""
    nofile: int = Field(1024, ge=64, le=1048576)
    """Open-file limit (``ulimit -n``) of every process in the container."""
    lifetime_s: int = Field(3600, ge=10, le=7 * 86400)
    """Hard lifetime: the container's main process is ``sleep <lifetime_s>``, so it stops by itself; ``gc`` removes it."""
    default_timeout_s: float = Field(30.0, gt=0, le=86400)
    """Default per-command timeout, seconds."""
    kill_after_s: float = Field(1.0, ge=0.1, le=60)
    """Grace between SIGTERM and SIGKILL when a command times out (``timeout --kill-after``)."""
    host_grace_s: float = Field(5.0, ge=0.5, le=600)
    """Extra seconds the host waits beyond timeout + kill_after before abandoning an exec and reaping it."""
    max_output_bytes: int = Field(65536, ge=256, le=64 << 20)
    """Bound on the output returned by ``exec`` (head and tail kept, middle replaced by a marker)."""
    max_file_bytes: int = Field(16 << 20, ge=1, le=1 << 30)
    """Bound on ``read_file`` / ``write_file`` sizes, bytes."""
    max_upload_bytes: int = Field(256 << 20, ge=1, le=16 << 30)
    """Bound on the total size of an ``upload`` archive, bytes."""
    fast_exec: bool = True
    """Run commands through a per-sandbox helper process (a few ms instead of a ``docker exec``); needs
    ``python3`` in the image, else (or if the helper keeps dying) commands use ``docker exec``."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables of the container (and every exec)."""
    binds: dict[str, str] = Field(default_factory=dict)
    """Host directories mounted read-only into the container: ``{host path: container path}``, both absolute
    (an agent container gets the policy endpoint's socket this way)."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra container labels (the ``agentrl.*`` labels are always set and cannot be overridden)."""
    api_timeout_s: float = Field(30.0, ge=1, le=600)
    """Timeout of every Docker API call, seconds."""
    retries: int = Field(3, ge=1, le=10)
    """Attempts for engine calls that fail transiently (5xx, connection errors)."""
    backoff_s: float = Field(0.2, ge=0.0, le=30)
    """Base delay of the exponential backoff between those attempts, seconds."""

    @field_validator("binds")
    @classmethod
    def _absolute(cls, v: dict[str, str]) -> dict[str, str]:
        for host, target in v.items():
            if not (host.startswith("/") and target.startswith("/")):
                raise SandboxConfigError(f"binds need absolute paths on both sides, not {host!r}: {target!r}")
        return v

    @field_validator("user", "keeper_user")
    @classmethod
    def _not_root(cls, v: str) -> str:
        if int(v.split(":")[0]) == 0 or int(v.split(":")[1]) == 0:
            raise SandboxConfigError("sandboxed processes never run as root (uid/gid 0)")
        return v

    @model_validator(mode="after")
    def _disk_fits_in_memory(self) -> SandboxConfig:
        need = self.workspace_mb + self.tmp_mb + self.headroom_mb
        if need > self.mem_mb:
            raise SandboxConfigError(
                f"workspace_mb ({self.workspace_mb}) + tmp_mb ({self.tmp_mb}) + headroom_mb ({self.headroom_mb}) = "
                f"{need} MiB does not fit in mem_mb ({self.mem_mb}): tmpfs pages count against the memory limit, so "
                f"a full workspace would OOM-kill the sandbox. Raise mem_mb to {need} or lower the sizes.")
        if self.runtime == "runsc":
            why = runsc_budget_error(self.workspace_mb, self.tmp_mb, self.headroom_mb, self.mem_mb, self.pids_limit)
            if why:
                raise SandboxConfigError(why)
        return self

    @property
    def uid_gid(self) -> tuple[int, int]:
        """``user`` as integers."""
        uid, gid = self.user.split(":")
        return int(uid), int(gid)


@dataclass(frozen=True)
class ExecResult:
    """Result of :meth:`DockerSandbox.exec`."""

    exit_code: int
    """Exit status of the command (124/137 when ``timeout`` stopped it, -1 if the host gave up waiting)."""
    output: str
    """stdout and stderr interleaved, UTF-8 decoded (invalid bytes replaced), bounded by ``max_output_bytes``."""
    timed_out: bool
    """Whether the command was stopped by its timeout (its processes were then killed)."""
    duration: float
    """Wall-clock seconds seen by the host."""
    truncated: bool = False
    """Whether ``output`` was cut (a marker shows where and how many bytes were dropped)."""
    oom_killed: bool = False
    """Whether the kernel killed a process of the command for memory (the output then ends with
    ``[killed: out of memory, limit N MiB]``; the exit status is usually 137)."""
    memory_refused: bool = False
    """Under ``runsc``: whether the command failed with an allocation refused at its per-process memory limit
    (recognised by its error message: ``MemoryError``, "Cannot allocate memory", ``std::bad_alloc``, "out of
    memory"); the output then ends with ``[out of memory: allocation refused, limit N MiB per process]``."""

    @property
    def ok(self) -> bool:
        """Exit status 0 and no timeout."""
        return self.exit_code == 0 and not self.timed_out
