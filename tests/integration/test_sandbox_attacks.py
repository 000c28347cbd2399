"""Attacks from inside a sandbox, under runc and under gVisor (runsc): each must be contained, and the sandbox
must stay usable (`echo ok`). Finally: a driver killed with SIGKILL takes its containers with it (its
warden), and no container survives ``gc`` (the second line, for a warden killed too)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentrl.sandbox import DockerSandbox, SandboxConfig, build_image, engine_reachable, gc
from agentrl.sandbox.runtime import engine_runtimes
from tests.conftest import require

pytestmark = pytest.mark.integration
OWNER = f"attack-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def image() -> str:
    ok, why = engine_reachable()
    require(ok, f"no Docker engine reachable ({why}); run `eval \"$(sandbox/provision.sh)\"`")
    return build_image()


@pytest.fixture(params=["runc", "runsc"])
def runtime(request: pytest.FixtureRequest, image: str) -> str:
    if request.param != "runc":
        import docker

        client = docker.from_env(timeout=30)
        try:
            have = engine_runtimes(client)
        finally:
            client.close()
        require(request.param in have, f"the engine has no {request.param} runtime (it has {sorted(have)}); "
                "run sandbox/provision.sh to install and register gVisor")
    return request.param


@pytest.fixture
async def sb(image: str, runtime: str) -> AsyncIterator[DockerSandbox]:
    # a small memory limit keeps the bombs short; the disks shrink with it (they must fit in it). Under
    # gVisor 64 MiB of it are the Sentry's and a full process table must fit in the headroom (2 MiB each)
    if runtime == "runsc":
        sizes = {"headroom_mb": 96, "pids_limit": 48}
    else:
        sizes = {"headroom_mb": 160}
    cfg = SandboxConfig(image=image, owner=OWNER, mem_mb=256, workspace_mb=64, tmp_mb=32, runtime=runtime, **sizes)
    async with DockerSandbox(cfg) as box:
        yield box
        ok = await box.exec("echo ok", timeout=10)
        assert ok.output == "ok\n", f"sandbox unusable after the attack: {ok}"


def _host_ip() -> str:
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    return out[0] if out else "172.17.0.1"


async def test_network_egress_and_dns_fail(sb: DockerSandbox) -> None:
    for target in ("1.1.1.1", "8.8.8.8", _host_ip(), "172.17.0.1"):
        r = await sb.exec(f"python3 -c \"import socket; socket.create_connection(('{target}', 80), timeout=3)\"")
        # runc: no route at all (loopback only); gVisor's netstack (--network=none) says "No route to host"
        assert r.exit_code != 0 and ("Network is unreachable" in r.output or "No route to host" in r.output), (target, r)
    r = await sb.exec("getent hosts example.com || python3 -c \"import socket; socket.getaddrinfo('deb.debian.org', 80)\"")
    assert r.exit_code != 0
    r = await sb.exec("cat /proc/net/dev | tail -n +3 | cut -d: -f1")
    assert r.output.split() == ["lo"]
    r = await sb.exec("curl -sS --max-time 3 http://1.1.1.1 || wget -q -T 3 -O- http://1.1.1.1")
    assert r.exit_code != 0  # not installed, and no route anyway


async def test_writes_outside_workspace_fail(sb: DockerSandbox) -> None:
    for path in ("/home/agent/.bashrc", "/var/tmp/x"):  # writable for the user but for the read-only root
        r = await sb.exec(f"echo pwned > {path}")
        assert r.exit_code != 0 and "Read-only file system" in r.output, (path, r)
    for path in ("/etc/evil", "/usr/bin/evil", "/evil"):  # root-owned: gVisor checks the permission first
        r = await sb.exec(f"echo pwned > {path}")
        denied = "Read-only file system" in r.output or (sb.config.runtime == "runsc" and "Permission denied" in r.output)
        assert r.exit_code != 0 and denied, (path, r)
    assert (await sb.exec("echo fine > /workspace/f && echo fine > /tmp/f")).ok
    r = await sb.exec("head -c 300M /dev/zero > /tmp/fill")  # tmpfs size cap (32 MiB here)
    assert r.exit_code != 0 and "No space left" in r.output
    assert (await sb.exec("test ! -e /var/run/docker.sock && test ! -e /run/docker.sock")).ok


@pytest.mark.parametrize("tail", ["exec sleep 30", "exit 2"], ids=["times-out", "returns"])
async def test_fork_bomb_is_contained(sb: DockerSandbox, tail: str) -> None:
    t0 = time.monotonic()
    r = await sb.exec(f"(bomb() {{ bomb | bomb & }}; bomb); {tail}", timeout=4)
    assert time.monotonic() - t0 < 20 and (r.timed_out or r.exit_code == 2), r
    for _ in range(4):  # a bomb still running: the first spawn failure resets the sandbox (and says so)
        n = await sb.exec("ps -u 1000 -o pid= | wc -l")
        if n.ok and n.output.strip():
            break
        assert not n.timed_out and "[process limit reached" in n.output, n
    assert n.exit_code == 0 and int(n.output) <= sb.config.pids_limit, n  # contained by the pids limit
    await sb.reset()  # a bomb that outlived its command (the "returns" case) is stopped on demand
    n = await sb.exec("ps -u 1000 -o pid= | wc -l")
    assert n.exit_code == 0 and int(n.output) < 10, n


async def test_memory_bomb_is_oom_killed(sb: DockerSandbox) -> None:
    r = await sb.exec("python3 -c \"a = [bytearray(1 << 20) for _ in range(2048)]; print('survived')\"", timeout=60)
    assert not r.timed_out and "survived" not in r.output, r
    if sb.config.runtime == "runsc":  # refused at the per-process limit: a host OOM kill would end the sandbox
        assert r.exit_code == 1 and "MemoryError" in r.output and r.memory_refused and not r.oom_killed, r
        assert r.output.endswith(f"[out of memory: allocation refused, limit {sb.config.headroom_mb} MiB per "
                                 "process]"), r
    else:
        assert r.exit_code == 137 and r.oom_killed and not r.memory_refused, r
        assert r.output.endswith(f"[killed: out of memory, limit {sb.config.mem_mb} MiB]"), r
    assert (await sb.exec("python3 -c \"a = bytearray(48 << 20); print(len(a))\"")).output == f"{48 << 20}\n"


async def test_processes_outliving_timeout_are_killed(sb: DockerSandbox) -> None:
    r = await sb.exec("nohup sleep 2001 >/dev/null 2>&1 & setsid sleep 2002 & "
                      "setsid sh -c 'env -i sleep 2003 &' ; sleep 60", timeout=1)
    assert r.timed_out
    ps = await sb.exec("ps -eo user:12,args")
    assert "sleep 20" not in ps.output, ps.output


async def test_privilege_escalation_fails(sb: DockerSandbox) -> None:
    status = (await sb.exec("grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status")).output
    assert "CapEff:\t0000000000000000" in status and "CapBnd:\t0000000000000000" in status
    nnp = await sb.exec("python3 -c 'import ctypes; print(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))'")
    assert nnp.output == "1\n", nnp  # PR_GET_NO_NEW_PRIVS (gVisor does not list it in /proc/self/status)
    if sb.config.runtime == "runc":  # under gVisor, the seccomp filter is on the Sentry, on the host side
        assert "NoNewPrivs:\t1" in status and "Seccomp:\t2" in status
    attacks = [
        "echo x | su -c id root",
        "sudo id",
        "mount -t tmpfs none /mnt",
        "unshare -r sh -c 'echo x > /etc/evil'" if sb.config.runtime == "runsc" else "unshare -r id",
        "unshare -m id",
        "python3 -c 'import os; os.setuid(0)'",
        "cp /bin/sh /tmp/sh && chmod u+s /tmp/sh && /tmp/sh -c 'test $(id -u) = 0'",
        "chown root /workspace",
        "find / -xdev -perm -4000 -type f 2>/dev/null | grep .",
        "kill -9 1",
        "pkill -9 -u 1001 sleep",
        "test -w /proc/sys/kernel/hostname && echo x > /proc/sys/kernel/hostname",
    ]
    # gVisor implements user namespaces inside its own kernel: `unshare -r` gives a root that holds no host
    # privilege (its uid 0 is the sandbox user), so there the test is that this root still cannot write
    for cmd in attacks:
        r = await sb.exec(cmd, timeout=10)
        assert r.exit_code != 0, (cmd, r)
    assert (await sb.exec("id -u")).output == "1000\n"


def _killed_driver(image: str, tmp_path: Path, owner: str, *, warden_too: bool) -> list[str]:
    """Start a driver with two sandboxes of ``owner``, SIGKILL it (its warden first if ``warden_too``);
    returns the container ids."""
    script = tmp_path / f"driver-{owner}.py"
    script.write_text(
        "import asyncio, sys, time\n"
        "from agentrl.sandbox import DockerSandbox, SandboxConfig\n"
        "from agentrl.core.utils.lifeline import warden_pid\n"
        "async def main():\n"
        f"    boxes = [await DockerSandbox(SandboxConfig(image={image!r}, owner={owner!r})).start()"
        " for _ in range(2)]\n"
        "    print(warden_pid(), ' '.join(b.id for b in boxes), flush=True)\n"
        "    time.sleep(600)\n"
        "asyncio.run(main())\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        warden, *ids = proc.stdout.readline().split()
        if warden_too:
            os.kill(int(warden), signal.SIGKILL)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert len(ids) == 2
    return ids


def _labelled(owner: str) -> list:
    import docker

    client = docker.from_env(timeout=30)
    try:
        return client.api.containers(all=True, filters={"label": f"agentrl.owner={owner}"})
    finally:
        client.close()


def test_a_killed_drivers_containers_go_with_it_and_gc_is_the_second_line(image: str, tmp_path: Path) -> None:
    """SIGKILL of a driver: its warden removes its containers within seconds. SIGKILL of the driver and its
    warden too: the containers stay until gc (default: dead drivers on this host, and expired sandboxes)."""
    owner = f"killed-{uuid.uuid4().hex[:8]}"
    _killed_driver(image, tmp_path, owner, warden_too=False)
    t0 = time.monotonic()
    while _labelled(owner):
        assert time.monotonic() - t0 < 10, "a killed driver's containers outlived it by 10 s"
        time.sleep(0.2)
    driver_owner = f"killed-both-{uuid.uuid4().hex[:8]}"
    ids = _killed_driver(image, tmp_path, driver_owner, warden_too=True)
    assert len(_labelled(driver_owner)) == 2, "with its warden killed first, nothing removes them but gc"
    removed = gc()
    assert set(ids) <= set(removed)
    gc(owner=OWNER)
    for o in (OWNER, driver_owner):
        assert _labelled(o) == []
