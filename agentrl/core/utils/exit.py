"""A quiet end for processes that loaded vLLM (and so Triton).

Triton's C++ bindings (nanobind) check for live objects when the interpreter is torn down, after every
``atexit`` handler and after Python's own finalisation, and print a screen of ``nanobind: leaked function
...`` / ``leaked instance ...`` lines to stderr: vLLM's Triton kernels are still referenced then. Nothing leaks
(the process is exiting), but the report reads as a failure at the end of every ``agentrl train``, ``eval``
and ``bench`` run. Triton does not expose nanobind's ``set_leak_warnings`` and nanobind reads no environment
variable, so the only switch left is where the report is written: :func:`quiet_teardown` registers an
``atexit`` handler that, at the very end of the ``atexit`` phase, flushes stdout, stderr and the logging
handlers and then points file descriptor 2 at ``/dev/null``. The exit is otherwise a normal one: non-daemon
threads are joined, every ``atexit`` handler registered afterwards (those that stop owned vLLM servers and
trainers) runs first with stderr intact, and the exit code is the command's. Only what the interpreter
writes while it dismantles itself (the leak report, ``Exception ignored in ... __del__`` noise) is dropped.

It acts only when vLLM or Triton was imported; ``AGENTRL_EXIT_DIAGNOSTICS=1`` keeps stderr open to the end
(to read those reports when debugging reference leaks).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys

NOISY_MODULES = ("triton._C.libtriton", "vllm")
"""Loaded: the interpreter's teardown is silenced (Triton's nanobind leak report)."""
KEEP_ENV = "AGENTRL_EXIT_DIAGNOSTICS"
"""Set to 1: keep stderr open through the teardown."""

_registered = False


def quiet_teardown() -> None:
    """Silence the interpreter's teardown diagnostics of this process (once; a no-op when called again).

    Call it early, before the command imports vLLM: ``atexit`` runs handlers last-registered first, so every
    handler registered after this one (server and trainer shutdown) still writes to the real stderr."""
    global _registered
    if not _registered:
        atexit.register(_silence_stderr)
        _registered = True


def _silence_stderr() -> None:
    if os.environ.get(KEEP_ENV, "") not in ("", "0") or not any(m in sys.modules for m in NOISY_MODULES):
        return
    for handler in list(logging.getLogger().handlers):
        try:
            handler.flush()
        except Exception:  # a broken handler must not stop the exit
            pass
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # closed, or a broken pipe: nothing left to flush
            pass
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        os.dup2(devnull, 2)
    except OSError:
        pass
    finally:
        os.close(devnull)
