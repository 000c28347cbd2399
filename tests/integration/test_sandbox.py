"""DockerSandbox / SandboxPool against a real engine (start one with sandbox/provision.sh)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from agentrl.sandbox import (
    DockerSandbox,
    SandboxConfig,
    SandboxError,
    SandboxPool,
    build_image,
    engine_reachable,
    gc,
)
from agentrl.sandbox._util import host_identity
from tests.conftest import require

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def sandbox_image() -> str:
    """The default sandbox image (built offline on first use: needs root + debootstrap)."""
    ok, why = engine_reachable()
    require(ok, f"no Docker engine reachable ({why}); run `eval \"$(sandbox/provision.sh)\"`")
    return build_image()


@pytest.fixture
def owner(sandbox_image: str) -> str:
    """A per-test run id; every container of the test is removed by owner at teardown."""
    run_id = f"test-{uuid.uuid4().hex[:8]}"
    yield run_id
    # only this test's containers: another worker's dead drivers and expired sandboxes are not its doing
    assert gc(owner=run_id, all_dead=False, expired=False) == [], "a test left a container behind"


@pytest.fixture
async def sb(sandbox_image: str, owner: str) -> AsyncIterator[DockerSandbox]:
    async with DockerSandbox(SandboxConfig(image=sandbox_image, owner=owner)) as box:
        yield box


def _docker():
    import docker

    return docker.from_env(timeout=30)


async def test_exec_basics(sb: DockerSandbox) -> None:
    r = await sb.exec("echo ok")
    assert (r.exit_code, r.output, r.timed_out, r.truncated) == (0, "ok\n", False, False) and r.ok
    r = await sb.exec("echo out; echo err >&2; exit 3")
    assert r.exit_code == 3 and "out\n" in r.output and "err\n" in r.output
    r = await sb.exec("id -u; pwd; echo $FOO", env={"FOO": "bar"})
    assert r.output.split() == ["1000", "/workspace", "bar"]
    assert (await sb.exec("pwd", workdir="/tmp")).output == "/tmp\n"
    assert (await sb.exec("""printf '%s' "it's a \\"test\\" $((1+1))" """)).output == 'it\'s a "test" 2'
    r = await sb.exec("printf '\\377\\376 bad utf8'")
    assert r.exit_code == 0 and r.output.endswith(" bad utf8")


async def test_output_truncation(sandbox_image: str, owner: str) -> None:
    cfg = SandboxConfig(image=sandbox_image, owner=owner, max_output_bytes=1024)
    async with DockerSandbox(cfg) as box:
        r = await box.exec("seq 1 100000")
        assert r.exit_code == 0 and r.truncated
        assert r.output.startswith("1\n2\n3\n") and r.output.endswith("99999\n100000\n")
        assert "output truncated" in r.output and len(r.output) < 1024 + 100


@pytest.mark.parametrize("fast_exec", [True, False], ids=["helper", "docker-exec"])
async def test_timeout_kills_process_tree(sandbox_image: str, owner: str, fast_exec: bool) -> None:
    cfg = SandboxConfig(image=sandbox_image, owner=owner, fast_exec=fast_exec)
    async with DockerSandbox(cfg) as box:
        cmd = ("sleep 1001 & nohup sleep 1002 >/dev/null 2>&1 & setsid sleep 1003 & "
               "(trap '' TERM; exec sleep 1004) & echo started; sleep 1005")
        t0 = time.monotonic()
        r = await box.exec(cmd, timeout=1)
        assert r.timed_out and r.exit_code != 0 and "started" in r.output
        assert time.monotonic() - t0 < 1 + cfg.kill_after_s + cfg.host_grace_s + 3
        ps = await box.exec("ps -u 1000 -o args=")
        assert ps.exit_code == 0 and "sleep" not in ps.output, ps.output
        assert (await box.exec("echo ok")).output == "ok\n"
        quick = await box.exec("exit 124")  # exit 124 without a timeout is not a timeout
        assert quick.exit_code == 124 and not quick.timed_out


async def test_files(sb: DockerSandbox, tmp_path) -> None:
    blob = bytes(range(256)) * 10
    await sb.write_file("data/blob.bin", blob)
    await sb.write_file("/workspace/hello.txt", "héllo\n")
    assert await sb.read_file("data/blob.bin") == blob
    assert await sb.read_file("/workspace/hello.txt") == "héllo\n".encode()
    assert (await sb.exec("stat -c %U data/blob.bin")).output == "agent\n"
    assert b"bookworm" in await sb.read_file("/etc/os-release")
    await sb.exec("echo tmp > /tmp/t")
    assert await sb.read_file("/tmp/t") == b"tmp\n"
    with pytest.raises(FileNotFoundError):
        await sb.read_file("nope.txt")
    with pytest.raises(FileNotFoundError):
        await sb.read_file("/etc/shadow")  # read as the sandbox user
    with pytest.raises(ValueError):
        await sb.write_file("/etc/evil", "x")
    with pytest.raises(ValueError):
        await sb.write_file("../etc/evil", "x")
    (tmp_path / "proj" / "pkg").mkdir(parents=True)
    (tmp_path / "proj" / "pkg" / "m.py").write_text("print('from upload')\n")
    (tmp_path / "proj" / "README").write_text("r\n")
    n = await sb.upload(tmp_path / "proj", "repo")
    assert n > 0
    r = await sb.exec("python3 pkg/m.py && cat README && stat -c %u pkg/m.py", workdir="/workspace/repo")
    assert r.output == "from upload\nr\n1000\n"


async def test_file_size_bounds(sandbox_image: str, owner: str) -> None:
    cfg = SandboxConfig(image=sandbox_image, owner=owner, max_file_bytes=1000)
    async with DockerSandbox(cfg) as box:
        await box.exec("head -c 5000 /dev/zero > big")
        with pytest.raises(ValueError):
            await box.read_file("big")
        with pytest.raises(ValueError):
            await box.write_file("w", b"x" * 1001)


async def test_labels_and_close_removes(sandbox_image: str, owner: str) -> None:
    import docker.errors

    client = _docker()
    box = await DockerSandbox(SandboxConfig(image=sandbox_image, owner=owner, lifetime_s=120)).start()
    attrs = client.api.inspect_container(box.id)
    labels = attrs["Config"]["Labels"]
    assert labels["agentrl.owner"] == owner and labels["agentrl.pid"] == str(os.getpid())
    assert labels["agentrl.host"] == host_identity()
    assert int(labels["agentrl.expires"]) - int(labels["agentrl.created"]) in (120, 121)
    assert attrs["HostConfig"]["NetworkMode"] == "none" and attrs["HostConfig"]["ReadonlyRootfs"]
    assert attrs["Config"]["Cmd"] == ["sleep", "120"]
    volumes = [m["Name"] for m in attrs["Mounts"] if m["Type"] == "volume"]
    await box.close()
    await box.close()  # idempotent
    with pytest.raises(docker.errors.NotFound):
        client.api.inspect_container(box.id)
    for v in volumes:
        with pytest.raises(docker.errors.NotFound):
            client.api.inspect_volume(v)


async def test_pool_single_use_and_fast(sandbox_image: str, owner: str) -> None:
    import docker.errors

    client = _docker()
    cfg = SandboxConfig(image=sandbox_image, owner=owner)
    async with SandboxPool(cfg, size=2, max_concurrency=4) as pool:
        await pool.wait_ready(120)
        t0 = time.monotonic()
        a = await pool.acquire()
        acquire_s = time.monotonic() - t0
        assert acquire_s < 1.0, f"warm acquire took {acquire_s:.3f}s"
        await a.exec("touch /workspace/mark")
        await pool.release(a)
        with pytest.raises(docker.errors.NotFound):
            client.api.inspect_container(a.id)
        async with pool.sandbox() as b:
            assert b.id != a.id
            assert (await b.exec("ls /workspace")).output == ""  # never sees a previous episode
        assert pool.stats["acquired_warm"] == 2
    assert gc(owner=owner, all_dead=False, expired=False) == []  # close() destroyed the warm ones


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
async def test_a_full_disk_is_an_error_message_and_the_sandbox_stays_usable(sandbox_image: str, owner: str,
                                                                            runtime: str) -> None:
    """Default budgets: both tmpfs fit in the memory limit with room to spare, so filling them is "No space
    left on device", not an OOM kill of the sandbox (which is what a 512 MiB limit did before). Under gVisor
    too, where a memory bomb is refused at the per-process limit instead of killed."""
    if runtime != "runc":
        from agentrl.sandbox.runtime import engine_runtimes

        have = engine_runtimes(_docker())
        require(runtime in have, f"the engine has no {runtime} runtime (it has {sorted(have)}); run sandbox/provision.sh")
    async with DockerSandbox(SandboxConfig(image=sandbox_image, owner=owner, runtime=runtime)) as sb:
        for target in ("big", "/tmp/big"):
            r = await sb.exec(f"head -c 2000M /dev/zero > {target}", timeout=60)
            assert r.exit_code != 0 and "No space left on device" in r.output and not r.oom_killed, r
        alive = await sb.exec("echo alive && python3 -c \"a = bytearray(128 << 20); print(len(a))\"")
        assert alive.output == f"alive\n{128 << 20}\n", alive
        r = await sb.exec("python3 -c \"a = [bytearray(1 << 20) for _ in range(4096)]\"", timeout=60)
        if runtime == "runsc":
            assert r.exit_code == 1 and r.memory_refused and f"limit {sb.config.headroom_mb} MiB per process" in r.output, r
        else:
            assert r.exit_code == 137 and r.oom_killed and f"limit {sb.config.mem_mb} MiB" in r.output, r
        assert (await sb.exec("rm big /tmp/big && echo ok")).output == "ok\n"


async def test_an_unknown_runtime_is_a_clear_error_and_leaves_nothing(sandbox_image: str, owner: str) -> None:
    cfg = SandboxConfig(image=sandbox_image, owner=owner, runtime="no-such-runtime")
    with pytest.raises(SandboxError, match="is the runtime 'no-such-runtime' registered with the engine"):
        await DockerSandbox(cfg).start()
    assert gc(owner=owner, all_dead=False, expired=False) == []
