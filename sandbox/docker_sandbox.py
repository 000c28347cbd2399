"""One Docker container as a sandbox for tool calls: ``async with DockerSandbox() as sb: await sb.exec("ls")``.

Blocking SDK calls run in worker threads; each sandbox is meant for ONE episode and is destroyed on close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
import re
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from agentrl.core.utils.lifeline import own_containers

from ._engine import (
    BadSandboxRequest,
    SandboxError,
    SandboxTooLarge,
    SandboxUnavailable,
    docker_host,
    is_connection_error,
    make_client,
    retry,
    to_thread,
)
from ._fastexec import SPAWN_EAGAIN, ExecHelper, HelperBroken
from ._stream import run_exec
from ._util import (
    REAP_SCRIPT,
    OutputBuffer,
    build_labels,
    container_kwargs,
    dir_tar,
    file_tar,
    read_file_command,
    workspace_relpath,
    wrap_command,
)
from .config import ExecResult, SandboxConfig, default_owner
from .runtime import process_mem_limit_mb, reap_runtime_leftovers

__all__ = ["DockerSandbox", "ExecResult", "SandboxConfig", "SandboxFileNotFound", "container_kwargs"]
OOM_COUNTER_SCRIPT = "cat /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null; true"
"""Prints the container cgroup's ``oom_kill N`` line (cgroup v2, or v1 on kernels that count kills)."""
SHELL_FORK_FAILED = re.compile(rb"^sh: \d+: Cannot fork$", re.M)
"""What the command's ``sh`` prints when it cannot start a process (at the pids limit)."""
ENOMEM_MESSAGE = re.compile(rb"MemoryError|Cannot allocate memory|std::bad_alloc|out of memory", re.I)
"""What a failed allocation prints (Python, libc's strerror, C++, most runtimes): under runsc, a process over its
address-space limit fails this way instead of being killed."""

log = logging.getLogger("agentrl.sandbox")


class SandboxFileNotFound(SandboxError, FileNotFoundError):
    """``read_file`` could not read the file: missing, a directory, not readable by the sandbox user, or the
    read did not finish in time."""

    code = "sandbox.file_not_found"


class DockerSandbox:
    """A started container with bounded ``exec``, file transfer and guaranteed removal on ``close``."""

    def __init__(self, config: SandboxConfig | None = None, *, client: Any = None) -> None:
        self.config = config or SandboxConfig()
        self._client = client
        self._own_client = client is None
        self.id = ""
        self.labels: dict[str, str] = {}
        self.image = ""
        self.started_at = 0.0
        self._closed = False
        self._helper: ExecHelper | None = None
        self._helper_failures = 0
        self._oom_kills_seen = 0  # the container's OOM-kill counter when last read (a new one starts at 0)

    # -- lifecycle ---------------------------------------------------------------------------------
    async def __aenter__(self) -> DockerSandbox:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> DockerSandbox:
        """Create and start the container (retrying transient engine errors)."""
        await to_thread(self._start_sync)
        return self

    def _start_sync(self) -> None:
        cfg = self.config
        if self._client is None:
            self._client = make_client(cfg.docker_host, cfg.api_timeout_s)
        if not cfg.image:
            from .image import build_image

            self.image = build_image(client=self._client)
        else:
            self.image = cfg.image
        self.labels = build_labels(cfg.owner or default_owner(), cfg.lifetime_s, extra=cfg.labels)
        # this process's containers are removed when it ends, however it ends (before one exists: no window)
        own_containers(docker_host(cfg.docker_host),
                       {k: self.labels[k] for k in ("agentrl.pid", "agentrl.pidstart", "agentrl.host")})
        kwargs = container_kwargs(cfg, self.image, self.labels)
        try:
            container = retry(lambda: self._client.containers.create(**kwargs), cfg.retries, cfg.backoff_s, "create")
            self.id = container.id
            retry(container.start, cfg.retries, cfg.backoff_s, "start")
        except Exception as e:
            if self.id:
                self._remove_sync()
                if cfg.runtime != "runc":  # e.g. a hung runsc start leaves its sandbox and gofer running
                    reap_runtime_leftovers(self.id)
            if is_connection_error(e):
                raise SandboxUnavailable(f"no Docker engine reachable at {docker_host(cfg.docker_host)}: "
                                         f"start one with sandbox/provision.sh or set DOCKER_HOST ({e})") from e
            hint = ""
            if cfg.runtime != "runc" and "runtime" in str(e):
                hint = f" (is the runtime {cfg.runtime!r} registered with the engine? sandbox/provision.sh registers runsc)"
            raise SandboxError(f"could not start a sandbox from {self.image}: {e}{hint}") from e
        self.started_at = time.time()
        if cfg.fast_exec:  # start the helper now (off the critical path when pooled)
            helper = self._helper_for_exec()
            if helper is not None:
                helper.lock.release()

    async def close(self) -> None:
        """Remove the container and its workspace volume (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._helper is not None:
            self._helper.close()
        await to_thread(self._remove_sync)

    def _remove_sync(self) -> None:
        import docker.errors

        if self.id:
            cfg = self.config
            try:
                retry(lambda: self._client.api.remove_container(self.id, force=True, v=True),
                      cfg.retries, cfg.backoff_s, "remove")
            except docker.errors.NotFound:
                pass
            except Exception as e:  # gc removes it later (labels)
                log.warning("could not remove sandbox %s: %s", self.id[:12], e)
        if self._own_client and self._client is not None:
            self._client.close()

    @property
    def expires_at(self) -> float:
        """Unix time at which the container stops by itself."""
        return float(self.labels.get("agentrl.expires", 0))

    # -- commands ----------------------------------------------------------------------------------
    def _check(self) -> None:
        if not self.id or self._closed:
            raise SandboxError("sandbox is not running (not started, or closed)")

    def _helper_for_exec(self) -> ExecHelper | None:
        """The fast-exec helper, (re)started if needed, locked for the caller; None: use docker exec."""
        if not self.config.fast_exec or self._helper_failures >= 3:
            return None
        helper = self._helper
        if helper is None or not helper.alive:
            try:
                helper = self._helper = ExecHelper(self._client.api, self.id, self.config.user)
            except Exception as e:
                self._helper_failures += 1
                log.info("sandbox %s: fast exec unavailable (%s); using docker exec", self.id[:12], e)
                return None
        return helper if helper.lock.acquire(blocking=False) else None  # busy: a concurrent exec

    def _run_sync(self, argv: list[str], deadline_s: float, sink: Any, workdir: str, env: dict[str, str] | None,
                  holder: list[Any]) -> tuple[int | None, bool]:
        helper = self._helper_for_exec()
        if helper is not None:
            holder.append(helper)
            try:
                return helper.run(argv, workdir, env, deadline_s, sink)
            except HelperBroken:
                pass  # nothing was sent: fall back to docker exec
            finally:
                helper.lock.release()
        return run_exec(self._client.api, self.id, argv, user=self.config.user, workdir=workdir, env=env,
                        deadline_s=deadline_s, sink=sink, on_socket=holder.append)

    async def _run(self, argv: list[str], deadline_s: float, sink: Any, workdir: str | None = None,
                   env: dict[str, str] | None = None) -> tuple[int | None, bool]:
        self._check()
        holder: list[Any] = []
        try:
            return await to_thread(self._run_sync, argv, deadline_s, sink, workdir or self.config.workspace,
                                   env, holder)
        except asyncio.CancelledError:
            for h in holder:  # unblock the worker thread, then kill what the command left
                with contextlib.suppress(OSError):
                    h.close() if isinstance(h, ExecHelper) else h.shutdown(socket.SHUT_RDWR)
            await asyncio.shield(self._reap())
            raise
        except Exception as e:
            raise SandboxError(f"exec in sandbox {self.id[:12]} failed: {e}") from e

    async def exec(self, cmd: str, timeout: float | None = None, workdir: str | None = None,
                   env: dict[str, str] | None = None) -> ExecResult:
        """Run ``cmd`` with ``sh -c`` under ``timeout``; output (stdout+stderr) is bounded.

        On timeout every process of the sandbox user is killed (including ones that escaped with
        ``setsid``/``nohup``), so a later exec sees none of them. The same happens, followed by one
        retry, when the command cannot even be spawned because the pids limit is exhausted.
        """
        cfg = self.config
        t = cfg.default_timeout_s if timeout is None else float(timeout)
        mem_limit = process_mem_limit_mb(cfg.runtime, cfg.headroom_mb)
        argv = wrap_command(cmd, t, cfg.kill_after_s, mem_limit)
        buf = OutputBuffer(cfg.max_output_bytes)
        t0 = time.monotonic()
        code, host_gave_up = await self._run(argv, t + cfg.kill_after_s + cfg.host_grace_s,
                                             lambda _s, p: buf.add(p), workdir, env)
        at_limit = False
        if code == SPAWN_EAGAIN or (code == 125 and b"timeout: fork system call failed" in buf.getvalue()):
            # at the pids limit (e.g. a fork bomb still running): reset, retry once
            log.warning("sandbox %s is at its pids limit: killing its processes", self.id[:12])
            await self._reap()
            buf = OutputBuffer(cfg.max_output_bytes)
            code, host_gave_up = await self._run(argv, t + cfg.kill_after_s + cfg.host_grace_s,
                                                 lambda _s, p: buf.add(p), workdir, env)
            code = 126 if code == SPAWN_EAGAIN else code
            at_limit = code in (125, 126)  # still no room: the bomb refilled the table
        duration = time.monotonic() - t0
        timed_out = host_gave_up or (code in (124, 137) and duration >= t * 0.98)
        # the command's own shell could not fork: its processes (or a bomb it left) fill the process table
        at_limit = at_limit or (code == 2 and not timed_out and SHELL_FORK_FAILED.search(buf.getvalue()) is not None)
        if timed_out or at_limit:
            await self._reap()
        output = buf.getvalue().decode("utf-8", "replace")
        if at_limit:
            log.warning("sandbox %s is at its pids limit: killed its processes", self.id[:12])
            output += (f"\n[process limit reached (pids_limit {cfg.pids_limit}): every process of the sandbox "
                       "was killed; run the command again]")
        oom = code == 137 and not timed_out and await self._oom_killed_since_last_look()
        if oom:
            output += f"\n[killed: out of memory, limit {cfg.mem_mb} MiB]"
        refused = (mem_limit is not None and code not in (0, None) and not timed_out and not oom
                   and ENOMEM_MESSAGE.search(buf.getvalue()) is not None)
        if refused:
            output += f"\n[out of memory: allocation refused, limit {mem_limit} MiB per process]"
        return ExecResult(exit_code=-1 if code is None else code, output=output, timed_out=timed_out,
                          duration=duration, truncated=buf.truncated, oom_killed=oom, memory_refused=refused)

    async def _oom_killed_since_last_look(self) -> bool:
        """Whether the container's cgroup counted an OOM kill since the last look (cgroup v2
        ``memory.events`` or v1 ``memory.oom_control``: ``oom_kill N``)."""
        out = OutputBuffer(4096)
        try:
            await to_thread(run_exec, self._client.api, self.id, ["sh", "-c", OOM_COUNTER_SCRIPT],
                            user=self.config.user, workdir="/", env=None, deadline_s=10,
                            sink=lambda _s, p: out.add(p))
        except Exception as e:
            log.warning("reading the OOM counter of sandbox %s failed: %s", self.id[:12], e)
            return False
        counts = [int(m) for m in re.findall(rb"^oom_kill (\d+)$", out.getvalue(), re.M)]
        if not counts:
            return False
        seen, self._oom_kills_seen = self._oom_kills_seen, max(counts)
        return max(counts) > seen

    async def reset(self) -> None:
        """Kill every process of the sandbox user (what a timeout does); files are kept. Raises SandboxError
        when some could not be killed (the sandbox should then be replaced)."""
        self._check()
        if not await self._reap():
            raise SandboxError(f"sandbox {self.id[:12]}: could not kill every process of its user")

    async def _reap(self) -> bool:
        """Kill every process of the sandbox user (PID 1 and the lifetime timer run as another uid); whether
        none is left. The fast-exec helper does it without forking while it is alive (a fork bomb keeps the
        process table full, so a new process may not start); otherwise an exec does, retried for the same
        reason."""
        helper = self._helper
        if helper is not None and helper.alive and helper.lock.acquire(blocking=False):
            try:
                for _ in range(3):  # survivors reported: the helper stays (it needs no free slot), try again
                    if await to_thread(helper.reap):
                        return True
                    if not helper.alive:
                        break
            finally:
                helper.lock.release()
        if self._helper is not None:
            self._helper.close()  # the reaper kills it anyway; the next exec starts a fresh one
        for attempt in range(4):
            try:
                code, _ = await to_thread(run_exec, self._client.api, self.id, ["sh", "-c", REAP_SCRIPT],
                                          user=self.config.user, workdir="/", env=None, deadline_s=10,
                                          sink=lambda _s, _p: None)
                if code == 0:
                    return True
            except Exception as e:
                log.warning("reaping sandbox %s failed: %s", self.id[:12], e)
            await asyncio.sleep(0.2 * 2**attempt)
        log.warning("sandbox %s: processes of its user may still run (no reaper could start)", self.id[:12])
        return False

    # -- files -------------------------------------------------------------------------------------
    async def read_file(self, path: str) -> bytes:
        """Contents of ``path`` (absolute, or relative to the workspace), read as the sandbox user.

        Raises SandboxFileNotFound (a FileNotFoundError) when it cannot be read, SandboxTooLarge (a ValueError)
        beyond ``max_file_bytes``.
        """
        cfg = self.config
        full = posixpath.join(cfg.workspace, path)
        out, err = bytearray(), OutputBuffer(4096)

        def sink(stream: int, payload: bytes) -> None:
            if stream == 1:
                out.extend(payload)
            else:
                err.add(payload)

        code, gave_up = await self._run(read_file_command(full, cfg.max_file_bytes), cfg.api_timeout_s, sink)
        if gave_up or code != 0:
            raise SandboxFileNotFound(f"{full}: {err.getvalue().decode('utf-8', 'replace').strip() or 'unreadable'}")
        if len(out) > cfg.max_file_bytes:
            raise SandboxTooLarge(f"{full} is larger than max_file_bytes={cfg.max_file_bytes}")
        return bytes(out)

    async def write_file(self, path: str, content: str | bytes, mode: int = 0o644) -> None:
        """Write ``content`` to ``path`` inside the workspace (parents created), owned by the sandbox user.

        Raises SandboxTooLarge (a ValueError) beyond ``max_file_bytes``, BadSandboxRequest (a ValueError) for a
        path outside the workspace or the workspace itself.
        """
        self._check()
        cfg = self.config
        data = content.encode() if isinstance(content, str) else bytes(content)
        if len(data) > cfg.max_file_bytes:
            raise SandboxTooLarge(f"{len(data)} bytes exceed max_file_bytes={cfg.max_file_bytes}")
        rel = workspace_relpath(cfg.workspace, path)
        if rel == ".":
            raise BadSandboxRequest("path names the workspace itself")
        tar = file_tar(rel, data, *cfg.uid_gid, mode=mode & 0o777)
        await to_thread(self._put, tar)

    async def upload(self, local_dir: str | Path, remote_dir: str = ".") -> int:
        """Copy the contents of ``local_dir`` into ``remote_dir`` (inside the workspace); returns bytes sent."""
        self._check()
        cfg = self.config
        rel = workspace_relpath(cfg.workspace, remote_dir)

        def go() -> int:
            with tempfile.SpooledTemporaryFile(max_size=8 << 20) as f:
                n = dir_tar(local_dir, rel, *cfg.uid_gid, out=f, max_bytes=cfg.max_upload_bytes)
                self._put(f)
                return n

        return await to_thread(go)

    def _put(self, data: Any) -> None:
        cfg = self.config

        def put() -> None:
            if hasattr(data, "seek"):
                data.seek(0)
            if not self._client.api.put_archive(self.id, cfg.workspace, data):
                raise SandboxError("put_archive was refused")

        try:
            retry(put, cfg.retries, cfg.backoff_s, "put_archive")
        except SandboxError:
            raise
        except Exception as e:
            raise SandboxError(f"writing into sandbox {self.id[:12]} failed: {e}") from e
