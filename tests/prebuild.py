"""The embedded tiny model, built in a background process while the tests that do not need it run.

A fresh checkout has no ``models/tiny``; building it takes minutes of the session. The build runs in a child
process from collection on; the session fixture ``tiny_model_dir`` calls the same idempotent build, which
waits on the build's file lock and then finds the model up to date (or builds it itself, with its error in
the test's report, when the background build failed). The child is owned (``agentrl.utils.lifeline``): it
ends with the session, however the session ends.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

MODEL_FIXTURE = "tiny_model_dir"
"""The session fixture that needs the embedded model (directly or through another fixture)."""
ROOT = Path(__file__).resolve().parents[1]

_proc: subprocess.Popen | None = None
_BUILD = ("import sys; from agentrl.modelgen import build_tiny_model; "
          "build_tiny_model(sys.argv[1], progress=False)")


def model_dir() -> Path:
    """The session's embedded model: the default directory of this checkout, reused by later sessions and by
    ``make train``."""
    from agentrl.modelgen import DEFAULT_TINY_DIR

    return ROOT / DEFAULT_TINY_DIR


def start() -> None:
    """Start the background build once (a no-op child when the model is up to date)."""
    global _proc
    if _proc is not None:
        return
    from agentrl.utils.lifeline import own_process

    log = ROOT / ".pytest_cache"
    log.mkdir(exist_ok=True)
    with (log / "tiny-model-build.log").open("w") as err:
        _proc = subprocess.Popen([sys.executable, "-c", _BUILD, str(model_dir())], cwd=ROOT, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    own_process(_proc.pid)


def stop() -> None:
    """End a background build still running (the session ended first) and reap it."""
    from agentrl.utils.lifeline import release_process

    if _proc is None or _proc.poll() is not None:
        return
    _proc.kill()
    _proc.wait(timeout=30)
    release_process(_proc.pid)
