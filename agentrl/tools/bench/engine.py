"""The engine a benchmark measures on: a vLLM server of its own, or one already running (``--endpoint``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A new temporary directory for a benchmark's engine and trainer files: removed when the block ends
    normally, kept (and its path logged) when it raises, so the logs of a failed run are not lost."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield work
    except BaseException:
        log.warning("benchmark files kept for their logs: %s", work)
        raise
    shutil.rmtree(work, ignore_errors=True)


def add_engine_args(parser: argparse.ArgumentParser, needs: str = "") -> None:
    """``--model`` and ``--endpoint``, the same for every benchmark that runs on one engine; ``needs`` says
    what a running server must have been started with."""
    parser.add_argument("--model", default=None, help="model directory (default: the embedded tiny model)")
    parser.add_argument("--chat-template", default=None,
                        help="render turns with this chat template instead of the model's own: a built-in name "
                             "(hermes) or a Jinja file (for models whose template shows no tools)")
    parser.add_argument("--endpoint", default=None, help=f"a running vLLM server of --model{f' ({needs})' if needs else ''} "
                        "to use instead of starting one")


async def bench_model(model: str | Path | None) -> str:
    """The model directory to measure: ``model``, or the embedded tiny model (its pinned files installed
    when missing, in a thread: the copy and its digest check stay off the benchmark's event loop)."""
    if model:
        return str(model)
    from agentrl.tools.modelgen import DEFAULT_TINY_DIR, ensure_embedded

    return str(await asyncio.to_thread(ensure_embedded, DEFAULT_TINY_DIR))


@asynccontextmanager
async def engine_url(endpoint: str | None, work: Path | None = None, **server: Any) -> AsyncIterator[str]:
    """The URL of ``endpoint``, or of a vLLM server started with ``VLLMServerConfig(**server)`` and stopped on
    exit (its log in ``work``, by default a ``scratch_dir``)."""
    if endpoint:
        yield endpoint
        return
    from agentrl.inference import VLLMServer, VLLMServerConfig

    with scratch_dir("agentrl-bench-engine-") if work is None else nullcontext(work) as logs:
        own = VLLMServer(VLLMServerConfig(**server), logs)
        await asyncio.to_thread(own.start)
        try:
            yield own.url
        finally:
            await asyncio.to_thread(own.stop)
