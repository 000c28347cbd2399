"""A process that loaded vLLM (so Triton) ends quietly: Triton's nanobind teardown report ("nanobind: leaked
...") is not printed, while atexit handlers, buffered output, tracebacks and the exit code are kept."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton._C.libtriton")

# One live Triton object at exit, as vLLM's Triton kernels are on a GPU host (on a CPU host vLLM disables
# Triton, so nothing is left alive and the report never shows).
LEAK = "import ctypes, triton._C.libtriton as lt; ctypes.pythonapi.Py_IncRef(ctypes.py_object(lt.ir.context()))"


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **env})


PROCESS = f"""
    import atexit, sys
    from agentrl.core.utils.exit import quiet_teardown
    quiet_teardown()
    {LEAK}
    atexit.register(lambda: print("cleanup ran", file=sys.stderr))  # e.g. stopping owned vLLM servers
    sys.stdout.write("result")  # no newline: still flushed
"""


def test_teardown_report_is_silenced_and_cleanup_kept() -> None:
    shown = _python(PROCESS + "    sys.exit(3)\n", AGENTRL_EXIT_DIAGNOSTICS="1")
    if "nanobind: leaked" not in shown.stderr:
        pytest.skip("this Triton reports no leak at exit: nothing to silence")
    r = _python(PROCESS + "    sys.exit(3)\n")
    assert (r.returncode, r.stdout) == (3, "result")
    assert "cleanup ran" in r.stderr and "nanobind" not in r.stderr, r.stderr


def test_errors_keep_their_traceback_and_exit_code() -> None:
    r = _python(PROCESS + "    raise RuntimeError('boom')\n")
    assert r.returncode == 1 and r.stdout == "result"
    assert "RuntimeError: boom" in r.stderr and "cleanup ran" in r.stderr and "nanobind" not in r.stderr


def test_no_triton_no_change() -> None:
    """Without vLLM or Triton loaded stderr stays open to the end (a handler that runs after ours prints)."""
    r = _python("""
        import atexit, sys
        atexit.register(lambda: print("last words", file=sys.stderr))
        from agentrl.core.utils.exit import quiet_teardown
        quiet_teardown()
    """)
    assert r.returncode == 0 and "last words" in r.stderr


def test_the_cli_installs_it() -> None:
    r = _python(f"""
        {LEAK}
        from agentrl.cli import app
        app(["envs"])
    """)
    assert r.returncode == 0 and "calc" in r.stdout
    assert "nanobind" not in r.stderr, r.stderr
