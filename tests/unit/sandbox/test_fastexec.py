"""The fast-exec helper's server loop, run here as the plain Python process it is in a sandbox: what a
command writes just before it exits reaches the host even when the helper is descheduled between its
last look at the pipe and its look at the exit status (a loaded host; CI lost a `git rev-parse` this way)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

from agentrl.sandbox._fastexec import SERVER_SRC

# After a look at the pipe that found nothing, the helper is held for 0.3 s: the command writes and exits
# in that gap, as on a host too loaded to run the helper for a while.
SLOW_HOST = """
import select as _select, time as _time
_look = _select.select
def _slow(r, w, x, timeout=None):
    ready = _look(r, w, x, timeout)
    if timeout and not ready[0]:
        _time.sleep(0.3)
    return ready
_select.select = _slow
"""


def _run(argv: list[str], prelude: str = "") -> tuple[bytes, int]:
    """One request to a local helper: (output, exit status)."""
    helper = subprocess.Popen([sys.executable, "-I", "-S", "-u", "-c", prelude + SERVER_SRC], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    try:
        out, _ = helper.communicate(json.dumps({"argv": argv, "cwd": "/", "env": {}}).encode() + b"\n", timeout=30)
    finally:
        helper.kill()
    frames, i = [], 0
    while i < len(out):
        kind, size = struct.unpack(">cI", out[i : i + 5])
        frames.append((kind, out[i + 5 : i + 5 + size]))
        i += 5 + size
    assert frames[0] == (b"h", b"") and frames[-1][0] == b"x", frames
    return b"".join(p for k, p in frames if k == b"o"), int(frames[-1][1])


def test_output_written_just_before_exit_is_kept_on_a_slow_host() -> None:
    out, code = _run(["sh", "-c", "sleep 0.1; echo base-commit-sha"], SLOW_HOST)
    assert (out, code) == (b"base-commit-sha\n", 0)


def test_output_and_exit_status() -> None:
    assert _run(["sh", "-c", "echo a; echo b >&2; exit 3"]) == (b"a\nb\n", 3)


def test_a_background_process_holding_the_pipe_does_not_hold_the_reply() -> None:
    out, code = _run(["sh", "-c", "(sleep 2; echo late) & echo now"], SLOW_HOST)
    assert (out, code) == (b"now\n", 0)
