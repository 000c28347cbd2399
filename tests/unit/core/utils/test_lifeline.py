"""The warden (agentrl.core.utils.lifeline): what a process owns ends when that process dies, SIGKILL included."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from agentrl.core.utils.lifeline import owned_processes
from tests.procs import descendants, start_time


def test_owned_processes_follows_parent_links_and_led_groups_only() -> None:
    # pid: (ppid, pgid, start)
    table = {
        1: (0, 1, "1"),
        10: (1, 10, "100"),   # the owner, leads its own group (a shell's job)
        11: (10, 10, "101"),  # root A: in the owner's group (not a leader): the group is not A's
        12: (10, 12, "102"),  # root B: leads group 12
        13: (12, 13, "103"),  # B's child in a session of its own (torchrun's rank)
        14: (13, 13, "104"),  # its grandchild
        15: (1, 12, "105"),   # a member of B's group reparented to init (a vLLM engine core)
        16: (10, 10, "106"),  # another child of the owner, in the owner's group: not owned
        17: (11, 10, "107"),  # A's child
    }
    got = owned_processes({11: "101", 12: "102"}, table)
    assert got == {11: "101", 12: "102", 13: "103", 14: "104", 15: "105", 17: "107"}
    assert owned_processes({12: "999"}, table) == {}, "a recycled pid (other start time) stands for nothing"
    assert owned_processes({99: "1"}, table) == {}


OWNER = textwrap.dedent("""
    import json, subprocess, sys, time
    from agentrl.core.utils import lifeline
    # a group leader with a child in the group and a grandchild in a session of its own
    tree = subprocess.Popen(["bash", "-c", "sleep 300 & setsid sleep 301 & wait"], start_new_session=True)
    lifeline.own_process(tree.pid)
    released = subprocess.Popen(["sleep", "302"], start_new_session=True)
    lifeline.own_process(released.pid)
    lifeline.release_process(released.pid)  # handed on: must survive its owner
    print(json.dumps({"tree": tree.pid, "released": released.pid, "warden": lifeline.warden_pid()}), flush=True)
    time.sleep(600)
""")


def test_a_sigkilled_owner_takes_what_it_owns_with_it(tmp_path: Path) -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True, start_new_session=True)
    released = None
    try:
        info = json.loads(owner.stdout.readline())
        released = info["released"]
        deadline = time.monotonic() + 10
        while len(tree := descendants(info["tree"])) < 2:  # both sleeps started
            assert time.monotonic() < deadline, tree
            time.sleep(0.05)
        owned = {p: start_time(p) for p in (info["tree"], *tree, info["warden"])}
        time.sleep(0.6)  # one warden scan: it has seen the tree
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(5)
        t0 = time.monotonic()
        while left := [p for p, s in owned.items() if start_time(p) == s]:
            assert time.monotonic() - t0 < 10, left
            time.sleep(0.05)
        assert start_time(released), "a released process is no longer the warden's"
    finally:
        if owner.poll() is None:
            owner.kill()
        if released and start_time(released):
            os.kill(released, signal.SIGKILL)
