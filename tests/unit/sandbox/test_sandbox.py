"""Sandbox logic that needs no engine: labels, output bounds, command wrapping, framing, paths, tars, config."""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import tarfile
import time

import pytest
from pydantic import ValidationError

from agentrl.sandbox import SandboxConfig, SandboxPool, SandboxUnavailable
from agentrl.sandbox._util import (
    HOST_ENV,
    FrameParser,
    OutputBuffer,
    build_labels,
    container_kwargs,
    dir_tar,
    file_tar,
    proc_start_time,
    read_file_command,
    workspace_relpath,
    wrap_command,
)
from agentrl.sandbox.gc import removal_reason


def test_labels() -> None:
    labels = build_labels("run-1", 60, pid=os.getpid(), host="h", now=1000.0,
                          extra={"team": "rl", "agentrl.owner": "spoofed"})
    assert labels["agentrl.owner"] == "run-1"
    assert labels["agentrl.pid"] == str(os.getpid())
    assert labels["agentrl.pidstart"] == proc_start_time(os.getpid()) != ""
    assert labels["agentrl.host"] == "h"
    assert (labels["agentrl.created"], labels["agentrl.expires"]) == ("1000", "1060")
    assert labels["team"] == "rl"


def test_host_identity_is_the_host_name_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    monkeypatch.delenv(HOST_ENV, raising=False)
    assert build_labels("run-1", 60)["agentrl.host"] == socket.gethostname()
    monkeypatch.setenv(HOST_ENV, "worker-3")
    assert build_labels("run-1", 60)["agentrl.host"] == "worker-3"


def test_output_buffer_fits_and_truncates() -> None:
    small = OutputBuffer(100)
    small.add(b"hello ")
    small.add(b"world")
    assert small.getvalue() == b"hello world" and not small.truncated
    big = OutputBuffer(100)
    for i in range(100):
        big.add(f"{i:04d}\n".encode())
    out = big.getvalue()
    assert big.truncated and big.total == 500
    assert out.startswith(b"0000\n0001\n") and out.endswith(b"0099\n")
    assert b"output truncated, 400 bytes omitted" in out
    assert len(out) < 100 + 80


def test_wrap_command_keeps_cmd_as_one_argument() -> None:
    cmd = """echo "a'b" $HOME; rm -rf / ; `id` $(id)"""
    assert wrap_command(cmd, 30) == ["timeout", "--kill-after=1s", "30s", "sh", "-c", cmd]
    assert wrap_command("true", 0.25, 2.5)[1:3] == ["--kill-after=2.5s", "0.25s"]
    with pytest.raises(ValueError):
        wrap_command("true", 0)
    limited = wrap_command(cmd, 30, mem_limit_mb=96)  # runsc: the address-space limit, then the same argv
    assert limited[:4] == ["sh", "-c", 'ulimit -v "$0" && exec "$@"', str(96 * 1024)]
    assert limited[4:] == wrap_command(cmd, 30)
    with pytest.raises(ValueError):
        wrap_command("true", 1, mem_limit_mb=0)
    argv = read_file_command("/tmp/a b;rm -rf /", 10)
    assert argv[-2:] == ["11", "/tmp/a b;rm -rf /"]


def test_frame_parser_across_chunks() -> None:
    raw = struct.pack(">BxxxL", 1, 5) + b"hello" + struct.pack(">BxxxL", 2, 3) + b"err"
    p = FrameParser()
    frames = []
    for i in range(len(raw)):
        frames += p.feed(raw[i : i + 1])
    assert frames == [(1, b"hello"), (2, b"err")]


def test_workspace_paths() -> None:
    assert workspace_relpath("/workspace", "a/b.txt") == "a/b.txt"
    assert workspace_relpath("/workspace", "/workspace/a/../b") == "b"
    assert workspace_relpath("/workspace", ".") == "."
    for bad in ("../etc/passwd", "/etc/passwd", "/workspace2/x", "a/../../x"):
        with pytest.raises(ValueError):
            workspace_relpath("/workspace", bad)


def test_file_tar_and_dir_tar(tmp_path) -> None:
    tar = tarfile.open(fileobj=io.BytesIO(file_tar("a/b/c.txt", b"xy", 1000, 1000)))
    assert [(m.name, m.isdir(), m.uid) for m in tar.getmembers()] == [
        ("a", True, 1000), ("a/b", True, 1000), ("a/b/c.txt", False, 1000)]
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "m.py").write_text("x = 1\n")
    suid = tmp_path / "src" / "run.sh"
    suid.write_text("#!/bin/sh\n")
    suid.chmod(0o4755)
    os.mkfifo(tmp_path / "src" / "fifo")
    buf = io.BytesIO()
    n = dir_tar(tmp_path / "src", "proj", 1000, 1000, buf, max_bytes=1000)
    buf.seek(0)
    members = {m.name: m for m in tarfile.open(fileobj=buf).getmembers()}
    assert set(members) == {"proj", "proj/pkg", "proj/pkg/m.py", "proj/run.sh"} and n == 16
    assert members["proj/run.sh"].mode == 0o755 and members["proj/pkg/m.py"].uid == 1000
    with pytest.raises(ValueError):
        dir_tar(tmp_path / "src", ".", 1000, 1000, io.BytesIO(), max_bytes=5)


def test_config_defaults_are_safe() -> None:
    cfg = SandboxConfig()
    kw = container_kwargs(cfg, "img", {"agentrl.owner": "x"})
    assert kw["network_mode"] == "none" and kw["read_only"] is True
    assert kw["cap_drop"] == ["ALL"] and kw["security_opt"] == ["no-new-privileges"]
    assert not any("seccomp" in s or "apparmor" in s for s in kw["security_opt"])
    assert kw["mem_limit"] == kw["memswap_limit"] == "1024m"
    assert kw["pids_limit"] == 128 and kw["nano_cpus"] == 10**9
    assert kw["command"] == ["sleep", "3600"] and kw["init"] is True and kw["runtime"] == "runc"
    assert kw["user"] == "1001:1001" != cfg.user == "1000:1000"
    assert "privileged" not in kw and "volumes" not in kw and "devices" not in kw
    assert "size=512m" in kw["mounts"][0]["VolumeOptions"]["DriverConfig"]["Options"]["o"]
    assert len(kw["mounts"]) == 1, "no host directory is mounted unless asked"
    assert "nosuid" in kw["tmpfs"]["/tmp"]


def test_binds_are_read_only_and_absolute() -> None:
    kw = container_kwargs(SandboxConfig(binds={"/host/dir": "/agentrl"}), "img", {})
    assert kw["mounts"][1] == {"Type": "bind", "Source": "/host/dir", "Target": "/agentrl", "ReadOnly": True}
    for bad in ({"rel": "/x"}, {"/x": "rel"}):
        with pytest.raises(ValidationError, match="absolute"):
            SandboxConfig(binds=bad)


def test_config_bounds() -> None:
    for bad in ({"user": "0:0"}, {"user": "1000:0"}, {"keeper_user": "0:1"}, {"pids_limit": 0},
                {"mem_mb": 1}, {"lifetime_s": 1}, {"max_output_bytes": 10}, {"workspace": "rel"}, {"runtime": "run c"},
                {"unknown": 1}):
        with pytest.raises(ValidationError):
            SandboxConfig(**bad)
    assert SandboxConfig.model_fields["network_mode"].description  # attribute docstrings are exported


def test_the_disk_must_fit_in_memory_so_a_full_disk_cannot_oom_the_sandbox() -> None:
    cfg = SandboxConfig()
    assert cfg.workspace_mb + cfg.tmp_mb + cfg.headroom_mb <= cfg.mem_mb
    with pytest.raises(ValidationError, match=r"workspace_mb \(512\) \+ tmp_mb \(128\) \+ headroom_mb \(256\) = 896 MiB "
                                              r"does not fit in mem_mb \(512\).*Raise mem_mb to 896"):
        SandboxConfig(mem_mb=512)
    assert SandboxConfig(mem_mb=512, workspace_mb=128).mem_mb == 512


def test_gc_reasons() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    now = 1000.0
    base = {"agentrl.owner": "o", "agentrl.host": "h", "agentrl.expires": "2000"}
    kw = {"owner": None, "all_dead": True, "expired": True, "host": "h", "now": now}
    me = {**base, "agentrl.pid": str(os.getpid()), "agentrl.pidstart": proc_start_time(os.getpid())}
    assert removal_reason(me, "running", **kw) == ""
    assert removal_reason(me, "running", **{**kw, "owner": "o"}) == "owner o"
    assert removal_reason({**me, "agentrl.expires": "999"}, "running", **kw) == "expired"
    assert removal_reason(me, "exited", **kw) == "status exited"
    assert "dead" in removal_reason({**base, "agentrl.pid": str(dead.pid)}, "running", **kw)
    assert "dead" in removal_reason({**me, "agentrl.pidstart": "1"}, "running", **kw)  # pid reused
    assert removal_reason({**base, "agentrl.pid": str(dead.pid)}, "running", **{**kw, "host": "other"}) == ""


def test_import_is_light() -> None:
    code = "import sys, agentrl.sandbox as s; s.SandboxConfig(); assert 'docker' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_unreachable_engine_is_a_clear_error(tmp_path) -> None:
    cfg = SandboxConfig(docker_host=f"unix://{tmp_path}/missing.sock", image="x")
    with pytest.raises(SandboxUnavailable, match=r"no Docker engine reachable at .*provision\.sh or set DOCKER_HOST"):
        await SandboxPool(cfg).start()


def test_image_pools_keep_the_first_images_of_the_plan_then_recent_ones() -> None:
    from agentrl.sandbox.image_pools import ImagePools

    pools = ImagePools(SandboxConfig(image="x"), per_image=1, max_images=2)
    assert pools.wanted() == []
    pools.plan(["a", "a", "b", "", "c", "b"])
    assert pools.wanted() == ["a", "b"]  # bounded: c waits until a or b is consumed
    pools._plan.remove("a")
    pools._plan.remove("a")
    assert pools.wanted() == ["b", "c"]
    pools._recent["z"] = None  # after the plan: the most recently used images
    pools.plan(["b"])
    assert pools.wanted() == ["b", "z"]
    pools._failed["b"] = "no such image"
    assert pools.wanted() == ["z"]
    pools.plan(["b"])  # re-planned: tried again
    assert pools.wanted() == ["b", "z"]
    with pytest.raises(ValueError):
        ImagePools(SandboxConfig(image="x"), per_image=-1)


def test_runsc_gets_a_host_pids_budget_for_the_sentry() -> None:
    from agentrl.sandbox.runtime import host_pids_limit

    assert container_kwargs(SandboxConfig(), "img", {})["pids_limit"] == 128
    kw = container_kwargs(SandboxConfig(runtime="runsc"), "img", {})
    # a fork bomb held at 128 guest processes peaked at 7,647 host pids
    assert kw["runtime"] == "runsc" and kw["pids_limit"] == host_pids_limit("runsc", 128) > 7647
    assert {"name": "nproc", "soft": 128, "hard": 128} in kw["ulimits"]  # counted inside gVisor's kernel
    assert not any(u["name"] == "nproc" for u in container_kwargs(SandboxConfig(), "img", {})["ulimits"])


def test_runsc_budgets_are_validated() -> None:
    from agentrl.sandbox.runtime import process_mem_limit_mb

    cfg = SandboxConfig(runtime="runsc")  # the defaults hold under gVisor too
    assert cfg.workspace_mb + cfg.tmp_mb + cfg.headroom_mb + 64 <= cfg.mem_mb
    assert process_mem_limit_mb("runsc", cfg.headroom_mb) == 256 and process_mem_limit_mb("runc", 256) is None
    SandboxConfig(mem_mb=256, workspace_mb=64, tmp_mb=32, headroom_mb=160)  # fine under runc
    with pytest.raises(ValidationError, match=r"under runsc, .* \+ 64 MiB for gVisor's Sentry = 320 MiB does not fit "
                                              r"in mem_mb \(256\).*Raise mem_mb to 320"):
        SandboxConfig(mem_mb=256, workspace_mb=64, tmp_mb=32, headroom_mb=160, runtime="runsc")
    with pytest.raises(ValidationError, match=r"pids_limit 128 x 2 MiB .* = 256 MiB\) does not fit in headroom_mb "
                                              r"\(96\).*lower pids_limit to 48"):
        SandboxConfig(mem_mb=256, workspace_mb=64, tmp_mb=32, headroom_mb=96, runtime="runsc")
    SandboxConfig(mem_mb=256, workspace_mb=64, tmp_mb=32, headroom_mb=96, pids_limit=48, runtime="runsc")


def test_runtime_leftovers_are_found_by_container_id_and_killed(tmp_path) -> None:
    from agentrl.sandbox.runtime import reap_runtime_leftovers, runtime_pids

    cid, other = "ab" * 32, "cd" * 32
    fake = tmp_path / "runsc-sandbox"
    fake.symlink_to(sys.executable)
    procs = [subprocess.Popen([str(fake), "-c", "import time; time.sleep(120)", f"--bundle=/run/x/{c}"])
             for c in (cid, other)]
    try:
        for _ in range(100):  # until the cmdlines are visible
            if runtime_pids(cid) and runtime_pids(other):
                break
            time.sleep(0.05)
        assert runtime_pids(cid) == [procs[0].pid] and runtime_pids("ab" * 6) == []
        assert reap_runtime_leftovers(cid) == [procs[0].pid]
        assert procs[0].wait(10) == -9 and procs[1].poll() is None  # only the named container's process
    finally:
        for p in procs:
            p.kill()
            p.wait()
