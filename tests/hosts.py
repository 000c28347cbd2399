"""Hosts on one machine, for the scale-out tests: network namespaces joined to the test's namespace by veth
pairs, each with a ``/dev/shm`` of its own, so a process on such a host shares neither loopback nor shared
memory with the test (or with the other hosts). The test's own namespace is the first host ("here"): every
link runs between it and one other host, so no traffic is forwarded between namespaces.

Every namespace and link is named after the pid of the test process that made it (``arl<pid>h<k>``,
``arl<pid>v<k>``): :func:`reap_stale` removes what a killed test session left (its pid is gone) and never
touches another live session's. Needs root and iproute2's ``ip`` (the CI machine has both).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

PREFIX = "arl"
_NAME = re.compile(rf"^{PREFIX}(\d+)[hv]\d+")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def missing() -> str | None:
    """Why hosts cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = f"{PREFIX}{os.getpid()}h99"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass(frozen=True)
class Host:
    """One host: a network namespace with an address on its link to the test's namespace."""

    name: str
    """The network namespace."""
    addr: str
    """Its address, as the test's namespace reaches it."""
    here: str
    """The test namespace's address on the same link (how this host reaches the test's processes)."""
    link: str
    """The link's end in the test's namespace (cut and restored with :meth:`cut` and :meth:`restore`)."""
    ifname: str
    """The link's end inside the host (for ``GLOO_SOCKET_IFNAME`` and the like)."""

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run on this host: in its network namespace, with a fresh ``/dev/shm`` of its own."""
        script = 'mount -t tmpfs -o size=1g,mode=1777 tmpfs /dev/shm && exec "$@"'
        return ["ip", "netns", "exec", self.name, "unshare", "--mount", "--propagation", "private",
                "sh", "-c", script, "host", *argv]

    def cut(self) -> None:
        """Take the link down at the host's end: packets to the host are dropped (connections hang, as to a
        node that is lost), while this side keeps its route, so nothing else answers for the host."""
        _ip("-n", self.name, "link", "set", self.ifname, "down")

    def restore(self) -> None:
        """Bring the link back up."""
        _ip("-n", self.name, "link", "set", self.ifname, "up")

    def pids(self) -> list[int]:
        """The processes running on this host."""
        out = _ip("netns", "pids", self.name, check=False).stdout
        return [int(p) for p in out.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(netns: str) -> None:
    """Kill every process of ``netns`` and delete it (its end of the link goes with it, and so the link)."""
    out = _ip("netns", "pids", netns, check=False).stdout
    for pid in out.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    _ip("netns", "del", netns, check=False)


def reap_stale() -> list[str]:
    """Remove the namespaces and links of test sessions that are gone; the names removed."""
    gone: list[str] = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NAME.match(name)
        if m and not _alive(int(m.group(1))):
            _remove(name)
            gone.append(name)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        name = parts[1].strip().split("@")[0] if len(parts) > 1 else ""
        m = _NAME.match(name)
        if m and not _alive(int(m.group(1))):
            _ip("link", "del", name, check=False)
            gone.append(name)
    return gone


def _addresses(k: int) -> tuple[str, str]:
    """The test side's and the host's address on link ``k`` (a /30 of 10.213.0.0/16 chosen by pid and k)."""
    index = ((os.getpid() % 4096) * 16 + 4 * k) % 65536
    a, b = index >> 8, index & 255
    return f"10.213.{a}.{b + 1}", f"10.213.{a}.{b + 2}"


@contextlib.contextmanager
def hosts(n: int) -> Iterator[list[Host]]:
    """``n`` hosts (at most 4), removed with everything running on them when the block ends, even after a
    failure; what a killed session left is removed first."""
    if not 1 <= n <= 4:
        raise ValueError(f"1 to 4 hosts, not {n}")
    reap_stale()
    pid, made, out = os.getpid(), [], []
    try:
        for k in range(n):
            host = Host(f"{PREFIX}{pid}h{k}", _addresses(k)[1], _addresses(k)[0], f"{PREFIX}{pid}v{k}",
                        f"{PREFIX}{pid}p{k}")
            _ip("netns", "add", host.name)
            made.append(host.name)
            _ip("link", "add", host.link, "type", "veth", "peer", "name", host.ifname)
            _ip("link", "set", host.ifname, "netns", host.name)
            _ip("addr", "add", f"{host.here}/30", "dev", host.link)
            _ip("link", "set", host.link, "up")
            for args in (("addr", "add", f"{host.addr}/30", "dev", host.ifname), ("link", "set", host.ifname, "up"),
                         ("link", "set", "lo", "up")):
                _ip("-n", host.name, *args)
            out.append(host)
        yield out
    finally:
        for ns in made:
            _remove(ns)
        for k in range(n):  # a link left in this namespace by a step that failed half-way
            _ip("link", "del", f"{PREFIX}{pid}v{k}", check=False)
