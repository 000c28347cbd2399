"""Pure helpers of the sandbox (no engine needed): labels, command wrapping, bounded output, stream
framing, workspace paths and tar building. Unit-tested in tests/unit/sandbox/test_sandbox.py."""

from __future__ import annotations

import io
import os
import posixpath
import socket
import struct
import tarfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from agentrl.core.utils.procs import stat_fields

from ._engine import BadSandboxRequest, SandboxError, SandboxTooLarge
from .runtime import guest_ulimits, host_pids_limit

if TYPE_CHECKING:
    from .config import SandboxConfig

LABEL_PREFIX = "agentrl."
OWNER_LABEL = "agentrl.owner"
HOST_ENV = "AGENTRL_SANDBOX_HOST"
"""Overrides the host name in ``agentrl.host``: drivers that share one Docker engine and one host name, but
must not sweep each other's containers (see :func:`host_identity`), each set a value of their own."""

# Run as the sandbox user after a timeout: kill every process that user owns (kill -1 spares the caller
# and PID 1; the keeper uid's init/timer are out of reach). Escapes via setsid/nohup/double fork die too.
# Stop first, then kill (``kill`` is a shell builtin: no fork needed): a stopped process cannot fork, so a
# fork bomb's members forked while a pass ran are caught by the next one instead of refilling the table.
REAP_SCRIPT = "kill -STOP -1 2>/dev/null; kill -STOP -1 2>/dev/null; kill -9 -1 2>/dev/null; kill -9 -1 2>/dev/null; exit 0"


def proc_start_time(pid: int) -> str:
    """Start time of ``pid`` in clock ticks since boot (field 22 of /proc/<pid>/stat), or "" if unknown.
    Stored next to the pid so that ``gc`` is not fooled by pid reuse."""
    fields = stat_fields(pid)
    return fields[19] if fields is not None else ""


def host_identity() -> str:
    """The host part of a container's driver identity (``agentrl.host``): ``$AGENTRL_SANDBOX_HOST``, else the
    host name. ``gc`` judges a driver dead only on its own host identity, so a driver never sweeps the
    containers of drivers under another one."""
    return os.environ.get(HOST_ENV) or socket.gethostname()


def build_labels(owner: str, lifetime_s: float, *, pid: int | None = None, host: str | None = None,
                 now: float | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The labels of a sandbox container: extra labels first, then the ``agentrl.*`` ones (which win)."""
    pid = os.getpid() if pid is None else pid
    now = time.time() if now is None else now
    labels = {k: v for k, v in (extra or {}).items() if not k.startswith(LABEL_PREFIX)}
    labels.update({
        OWNER_LABEL: owner,
        "agentrl.pid": str(pid),
        "agentrl.pidstart": proc_start_time(pid),
        "agentrl.host": host or host_identity(),
        "agentrl.created": str(int(now)),
        "agentrl.expires": str(int(now + lifetime_s + 0.999)),
    })
    return labels


def _secs(x: float) -> str:
    """Seconds for coreutils ``timeout``: ``2s``, ``0.5s`` (no exponent, no trailing zeros)."""
    return f"{x:.3f}".rstrip("0").rstrip(".") + "s"


def wrap_command(cmd: str, timeout_s: float, kill_after_s: float = 1.0, mem_limit_mb: int | None = None) -> list[str]:
    """argv of an exec: ``timeout --kill-after=K T sh -c CMD``. No quoting is involved: ``cmd`` is one argv
    element. ``timeout`` puts itself and the command in a new process group and signals the whole group.
    With ``mem_limit_mb``, a shell first sets the address-space limit (``ulimit -v``, soft and hard, so the
    command cannot raise it) and then ``exec``s the same argv."""
    if timeout_s <= 0:
        raise BadSandboxRequest("timeout must be positive")
    argv = ["timeout", f"--kill-after={_secs(kill_after_s)}", _secs(timeout_s), "sh", "-c", cmd]
    if mem_limit_mb is not None:
        if mem_limit_mb <= 0:
            raise BadSandboxRequest("mem_limit_mb must be positive")
        argv = ["sh", "-c", 'ulimit -v "$0" && exec "$@"', str(mem_limit_mb * 1024), *argv]
    return argv


def read_file_command(path: str, max_bytes: int) -> list[str]:
    """argv that prints at most ``max_bytes + 1`` bytes of ``path`` (one more, to detect oversize files)."""
    return ["sh", "-c", 'exec head -c "$1" -- "$2"', "sh", str(max_bytes + 1), path]


class OutputBuffer:
    """Keeps the first and last ``limit // 2`` bytes of a stream and counts the rest (bounded memory)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        """Append a chunk."""
        self.total += len(data)
        room = self.limit // 2 - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            keep = self.limit - self.limit // 2
            if len(self.tail) > keep:
                del self.tail[: len(self.tail) - keep]

    @property
    def truncated(self) -> bool:
        """Whether bytes were dropped."""
        return self.total > len(self.head) + len(self.tail)

    def getvalue(self) -> bytes:
        """Head + marker + tail (or everything, when it fits)."""
        if not self.truncated:
            return bytes(self.head + self.tail)
        dropped = self.total - len(self.head) - len(self.tail)
        marker = f"\n[... agentrl: output truncated, {dropped} bytes omitted ...]\n".encode()
        return bytes(self.head) + marker + bytes(self.tail)


class FrameParser:
    """Parses Docker's multiplexed exec stream: 8-byte headers (stream id, 3 zero bytes, big-endian size)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Add raw bytes; return the complete ``(stream, payload)`` frames (1 = stdout, 2 = stderr)."""
        self._buf += data
        out: list[tuple[int, bytes]] = []
        while len(self._buf) >= 8:
            stream, size = struct.unpack(">BxxxL", self._buf[:8])
            if len(self._buf) < 8 + size:
                break
            out.append((stream, bytes(self._buf[8 : 8 + size])))
            del self._buf[: 8 + size]
        return out


def workspace_relpath(workspace: str, path: str) -> str:
    """``path`` (absolute, or relative to the workspace) as a normalised path relative to the workspace;
    raises BadSandboxRequest (a ValueError) when it points outside (host-side writes only go to the workspace
    volume)."""
    full = posixpath.normpath(posixpath.join(workspace, path))
    ws = posixpath.normpath(workspace)
    if full == ws:
        return "."
    if not full.startswith(ws.rstrip("/") + "/"):
        raise BadSandboxRequest(f"{path!r} is outside the sandbox workspace {workspace}")
    return posixpath.relpath(full, ws)


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def _dir_info(name: str, uid: int, gid: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.uid, info.gid, info.mtime = tarfile.DIRTYPE, 0o755, uid, gid, int(time.time())
    return info


def file_tar(rel: str, content: bytes, uid: int, gid: int, mode: int = 0o644) -> bytes:
    """A tar holding ``rel`` (relative to the extraction dir) and its parent directories, owned by uid:gid."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in _parents(rel):
            tar.addfile(_dir_info(d, uid, gid))
        info = tarfile.TarInfo(rel)
        info.size, info.mode, info.uid, info.gid, info.mtime = len(content), mode, uid, gid, int(time.time())
        tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


class UploadNotADirectory(SandboxError, NotADirectoryError):
    """The local path given to ``upload`` is not a directory."""

    code = "sandbox.upload_not_a_directory"


def dir_tar(local_dir: str | os.PathLike[str], rel: str, uid: int, gid: int, out: BinaryIO,
            max_bytes: int) -> int:
    """Write to ``out`` a tar of ``local_dir``'s contents placed under ``rel`` (relative to the extraction
    dir), owned by uid:gid; returns the file bytes added. Raises UploadNotADirectory (a NotADirectoryError)
    when ``local_dir`` is not a directory, SandboxTooLarge (a ValueError) beyond ``max_bytes``."""
    root = Path(local_dir)
    if not root.is_dir():
        raise UploadNotADirectory(str(root))
    total = 0

    def owned(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        nonlocal total
        if not (info.isfile() or info.isdir() or info.issym()):
            return None  # no devices, fifos or hard links
        total += info.size
        if total > max_bytes:
            raise SandboxTooLarge(f"upload of {root} exceeds {max_bytes} bytes")
        info.uid, info.gid, info.uname, info.gname = uid, gid, "", ""
        info.mode &= 0o777  # never setuid/setgid/sticky
        return info

    with tarfile.open(fileobj=out, mode="w") as tar:
        for d in _parents(rel + "/x") if rel != "." else []:
            tar.addfile(_dir_info(d, uid, gid))
        for child in sorted(root.iterdir()):
            name = child.name if rel == "." else f"{rel}/{child.name}"
            tar.add(child, arcname=name, recursive=True, filter=owned)
    return total


def container_kwargs(cfg: SandboxConfig, image: str, labels: dict[str, str]) -> dict[str, Any]:
    """Arguments of ``containers.create`` for ``cfg`` (pure: unit-tested, no engine needed).

    PID 1 is Docker's init (tini, reaps orphans) running ``sleep <lifetime>`` as ``keeper_user``: the
    container stops by itself when the lifetime ends, and sandboxed code (``user``) cannot signal either.
    """
    uid, gid = cfg.uid_gid
    ws_opts = f"size={cfg.workspace_mb}m,uid={uid},gid={gid},mode=0755,nosuid,nodev"
    return {
        "image": image,
        "command": ["sleep", str(cfg.lifetime_s)],
        "user": cfg.keeper_user,
        "init": True,
        "detach": True,
        "labels": labels,
        "environment": dict(cfg.env),
        "working_dir": cfg.workspace,
        "hostname": "sandbox",
        "runtime": cfg.runtime,
        "network_mode": cfg.network_mode,
        "read_only": cfg.read_only_root,
        # The workspace is an anonymous volume backed by a size-capped tmpfs: writable from inside, reachable
        # by put_archive from the host (a plain --tmpfs mount is not), and removed with the container (v=True).
        "mounts": [{"Type": "volume", "Target": cfg.workspace, "ReadOnly": False,
                    "VolumeOptions": {"NoCopy": True, "DriverConfig": {
                        "Name": "local", "Options": {"type": "tmpfs", "device": "tmpfs", "o": ws_opts}}}},
                   *({"Type": "bind", "Source": host, "Target": target, "ReadOnly": True}
                     for host, target in cfg.binds.items())],
        "tmpfs": {"/tmp": f"rw,nosuid,nodev,size={cfg.tmp_mb}m,mode=1777"},
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],  # Docker's default seccomp profile stays on
        "pids_limit": host_pids_limit(cfg.runtime, cfg.pids_limit),
        "mem_limit": f"{cfg.mem_mb}m",
        "memswap_limit": f"{cfg.mem_mb}m",
        "nano_cpus": int(cfg.cpus * 1e9),
        "ulimits": [{"name": "nofile", "soft": cfg.nofile, "hard": cfg.nofile},
                    {"name": "core", "soft": 0, "hard": 0}, *guest_ulimits(cfg.runtime, cfg.pids_limit)],
        "ipc_mode": "private",
        "oom_score_adj": 500,  # under host memory pressure, sandboxes go first
        "log_config": {"type": "none", "config": {}},
    }
