"""Garbage collection of sandbox containers, by label (works after a crash or ``kill -9`` of a driver).

A container is removed when (a) it belongs to ``owner``; (b) its driver process, on this host, is dead
(pid gone, or reused: the recorded start time differs; "this host" is the host identity,
``$AGENTRL_SANDBOX_HOST`` or the host name); (c) its ``agentrl.expires`` time has passed or it has stopped.
Its tmpfs workspace volume goes with it.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

from ._engine import SandboxUnavailable, make_client
from ._util import OWNER_LABEL, host_identity, proc_start_time

log = logging.getLogger("agentrl.sandbox")


def _pid_alive(pid: int, start: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    return not start or proc_start_time(pid) in ("", start)


def removal_reason(labels: dict[str, str], status: str, *, owner: str | None, all_dead: bool,
                   expired: bool, host: str, now: float) -> str:
    """Why a container with these labels should be removed ("" = keep). Pure, unit-tested."""
    if owner is not None and labels.get(OWNER_LABEL) == owner:
        return f"owner {owner}"
    if expired:
        try:
            if float(labels.get("agentrl.expires", "inf")) < now:
                return "expired"
        except ValueError:
            pass
        if status in ("exited", "dead"):
            return f"status {status}"
    if all_dead and labels.get("agentrl.host") == host:
        try:
            pid = int(labels.get("agentrl.pid", ""))
        except ValueError:
            return ""
        if not _pid_alive(pid, labels.get("agentrl.pidstart", "")):
            return f"driver pid {pid} is dead"
    return ""


def gc(owner: str | None = None, all_dead: bool = True, expired: bool = True, *, client: Any = None,
       docker_host: str | None = None) -> list[str]:
    """Remove sandbox containers as described in the module docstring; return the removed ids."""
    import docker.errors

    own = client is None
    client = client or make_client(docker_host, timeout=30)
    removed: list[str] = []
    try:
        host, now = host_identity(), time.time()
        containers = client.api.containers(all=True, filters={"label": OWNER_LABEL})
        for c in containers:
            why = removal_reason(c.get("Labels") or {}, c.get("State", ""), owner=owner, all_dead=all_dead,
                                 expired=expired, host=host, now=now)
            if not why:
                continue
            try:
                client.api.remove_container(c["Id"], force=True, v=True)
                removed.append(c["Id"])
                log.info("gc: removed sandbox %s (%s)", c["Id"][:12], why)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as e:
                if "already in progress" not in str(e):
                    log.warning("gc: could not remove %s: %s", c["Id"][:12], e)
    finally:
        if own:
            client.close()
    return removed


def cleanup_on_start(docker_host: str | None = None) -> list[str]:
    """For drivers at start-up: remove leftovers of dead drivers and expired sandboxes; never raises
    when no engine is reachable (sandboxes are then unusable anyway, and say so when used)."""
    try:
        return gc(all_dead=True, docker_host=docker_host)
    except SandboxUnavailable as e:
        log.debug("sandbox gc skipped: %s", e)
        return []


def main(argv: list[str] | None = None) -> int:
    """``agentrl sandbox gc [--owner RUN_ID]``: print removed ids."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="agentrl sandbox gc",
        description="Remove sandbox containers whose driver died, whose lifetime expired or that stopped; "
                    "with --owner, every container of that run.")
    ap.add_argument("--owner", default=None, help="remove all containers of this run id")
    args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    owner = args.owner
    try:
        removed = gc(owner=owner)
    except SandboxUnavailable as e:
        print(str(e), file=sys.stderr)
        return 2
    for cid in removed:
        print(cid)
    print(f"removed {len(removed)} sandbox container(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
