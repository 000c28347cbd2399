"""``kill -USR1 <pid>`` on a running agentrl process prints every asyncio task with its stack to stderr:
where a run that seems stuck is waiting, without stopping it."""

from __future__ import annotations

import asyncio
import contextlib
import io
import signal
import sys


def dump_tasks(file: io.TextIOBase | None = None) -> int:
    """Print every task of the running loop with its stack; the number of tasks."""
    out = file or sys.stderr
    tasks = asyncio.all_tasks()
    print(f"--- {len(tasks)} asyncio task(s) ---", file=out)
    for task in sorted(tasks, key=lambda t: t.get_name()):
        print(f"* {task.get_name()}: {task.get_coro()!r}", file=out)
        task.print_stack(limit=12, file=out)
    out.flush()
    return len(tasks)


def install() -> None:
    """Dump the tasks on SIGUSR1 (where the platform has it; call inside the running loop)."""
    with contextlib.suppress(NotImplementedError, RuntimeError, AttributeError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump_tasks)
