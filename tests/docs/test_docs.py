"""The documentation is tested: its shell commands run as written (or are marked with the reason they
cannot run here), its Python and TOML are executed and validated, and its inline ``agentrl`` commands
name commands and flags that exist. See ``doc_blocks.py`` for the markers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tomllib

from tests.docs.doc_blocks import ROOT, SHELL, Block, agentrl_spans, all_blocks, doc_files, inline_commands

BLOCKS = all_blocks()
RUN = [b for b in BLOCKS if b.lang in SHELL and b.mark in ("", "repo")]
SESSIONS = sorted({b.source for b in BLOCKS if b.lang in SHELL and b.mark == "session"})
PYTHON = sorted({b.source for b in BLOCKS if b.lang == "python"})
BIN = Path(sys.executable).parent


def _shell(script: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """``script`` in bash (errors stop it; what it leaves running is stopped at the end), with this
    environment's ``agentrl`` first on PATH and no PYTHONPATH: what a user's shell has after install."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    log_out, log_err = cwd / ".doc-test.out", cwd / ".doc-test.err"
    with log_out.open("w") as out, log_err.open("w") as err:  # files: a background server keeps pipes open
        proc = subprocess.Popen(["bash", "-c", "set -euo pipefail\n" + script], cwd=cwd, env=env, text=True,
                                stdout=out, stderr=err, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        finally:  # the script's own process group: servers it started in the background, and nothing else
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    out_text, err_text = log_out.read_text(), log_err.read_text()
    log_out.unlink()
    log_err.unlink()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out_text, err_text)


def test_every_block_is_run_or_marked_with_a_reason() -> None:
    assert BLOCKS, "no documentation blocks found"
    for b in BLOCKS:
        assert b.mark in ("", "repo", "session") or (b.skip_reason is not None and len(b.skip_reason) > 10), \
            f"{b.id}: unknown marker or a skip without its reason: {b.mark!r}"
        if b.lang in ("", "text") and b.mark == "":
            continue  # diagrams and output samples
        if b.lang not in (*SHELL, "python", "toml", "", "text", "json"):
            raise AssertionError(f"{b.id}: a ```{b.lang} block that no test checks")


@pytest.mark.parametrize("block", RUN, ids=[b.id for b in RUN])
def test_shell_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    cwd = ROOT if block.mark == "repo" else tmp_path
    out = _shell(block.text, cwd, timeout=300)
    assert out.returncode == 0, f"{block.id} failed in {cwd}:\n{block.text}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"


@pytest.mark.parametrize("source", SESSIONS, ids=[str(p.relative_to(ROOT)) for p in SESSIONS])
def test_walkthrough_runs_as_written_in_one_shell(source: Path, tmp_path: Path) -> None:
    script = "\n".join(b.text for b in BLOCKS if b.source == source and b.mark == "session" and b.lang in SHELL)
    out = _shell(script, tmp_path, timeout=300)
    assert out.returncode == 0, f"{source.name} walkthrough failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"


class _Script:
    """A scripted policy for a documented environment without a reference solution."""

    name = "doc-script"

    def __init__(self, turns: list[str]) -> None:
        self._turns = turns

    def turns(self, env_cls: Any, task: Any) -> list[str]:
        return list(self._turns)


def _scripts() -> dict[str, list[str]]:
    from agentrl.rollout.scripted import tool_call_text as call

    return {  # class name -> the assistant turns of a winning episode on its first train task
        "Weather": [call("forecast", {"city": "Oslo"}), "It will rain."],
        "Lookup": [call("capital_of", {"country": "Peru"}), call("submit", {"answer": "Lima"})],
    }


@pytest.mark.parametrize("source", PYTHON, ids=[str(p.relative_to(ROOT)) for p in PYTHON])
def test_python_blocks_run(source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file's Python blocks run in order in one namespace; each environment they define generates its
    tool schemas and, where the test knows a winning script, scores 1.0 through the real agent loop."""
    import agentrl
    from agentrl.rollout.scripted import run_scripted

    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": f"doc_{source.stem}"}
    for b in (b for b in BLOCKS if b.source == source and b.lang == "python" and b.skip_reason is None):
        exec(compile(b.text, b.id, "exec"), namespace)
    envs = [v for v in namespace.values()
            if isinstance(v, type) and issubclass(v, agentrl.Environment) and v.__module__ == namespace["__name__"]]
    scripts = _scripts()
    for cls in envs:
        cls.tool_schemas()  # every tool's schema is derived from its signature and docstring
        if cls.__name__ in scripts:
            trajs = asyncio.run(run_scripted(cls, cls.tasks("train")[:1], _Script(scripts[cls.__name__])))
            assert trajs[0].reward == 1.0, (cls.__name__, trajs[0].stop_reason, trajs[0].error)


def test_toml_blocks_parse_and_run_configs_validate(tmp_path: Path) -> None:
    from agentrl.config.run import load_config

    for b in (b for b in BLOCKS if b.lang == "toml"):
        data = tomllib.loads(b.text)
        if b.text.startswith("# run.toml"):
            (tmp_path / "run.toml").write_text(b.text)
            load_config(tmp_path / "run.toml")  # raises on an unknown or invalid field
        else:
            assert data, b.id


def _help(args: list[str]) -> str:
    from click.testing import CliRunner
    from typer.main import get_command

    from agentrl.cli import app

    result = CliRunner().invoke(get_command(app), [*args, "--help"])
    return result.output


def test_inline_commands_name_real_commands_and_flags() -> None:
    from typer.main import get_command

    from agentrl.cli import app

    group = get_command(app)
    helps: dict[tuple[str, ...], str] = {}
    checked = 0
    for path in doc_files():
        for line, span in inline_commands(path):
            words = span.replace("\\|", "|").split()[1:]
            cmd: Any = group
            names: list[str] = []
            while words and hasattr(cmd, "commands") and not words[0].startswith("-"):
                name, *others = words[0].split("|")  # `agentrl bench sync|loop`: every alternative must exist
                for alt in (name, *others):
                    assert alt in cmd.commands, f"{path.name}:{line}: `{span}`: no command {alt!r}"
                cmd, names = cmd.commands[name], [*names, name]
                words = words[1:]
            key = tuple(names)
            if key not in helps:
                helps[key] = _help(names)
            for w in (w for w in shlex.split(" ".join(words).replace("[", " ").replace("]", " "))
                      if w.startswith("--")):
                flag = w.split("=")[0]
                assert flag in helps[key], f"{path.name}:{line}: `{span}`: {' '.join(names)} has no flag {flag}"
            checked += 1
    assert checked > 20, checked


def test_the_readmes_command_table_lists_every_command() -> None:
    """Every command and subcommand of the CLI has a row (or an alternative in one) in the README's table."""
    from typer.main import get_command

    from agentrl.cli import app

    table = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `agentrl ")]
    named: set[tuple[str, ...]] = set()
    for span in (s for row in table for s in agentrl_spans(row)):
        words = [w for w in span.replace("\\|", "|").split()[1:] if not w.startswith(("-", "[", "<"))]
        if words:
            named.add((words[0],))
            if len(words) > 1:
                named.update((words[0], alt) for alt in words[1].split("|"))
    group = get_command(app)
    missing = []
    for name, cmd in group.commands.items():
        subs = getattr(cmd, "commands", None)
        missing += [f"{name} {sub}" for sub in subs if (name, sub) not in named] if subs else (
            [name] if (name,) not in named else [])
    assert not missing, f"README.md's command table has no row for: agentrl {', agentrl '.join(missing)}"

