"""The newcomer's path: an environment in your own directory, named by module or by file, loads from
the installed ``agentrl`` command with no install and no PYTHONPATH; what cannot load says why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from agentrl.environment.registry import UnknownEnvironmentError, canonical_spec, load_env

AGENTRL = str(Path(sys.executable).parent / "agentrl")  # the console script users run, not ``python -m``

ENV_SOURCE = textwrap.dedent('''
    import agentrl
    from {helper} import ANSWER


    class Echo(agentrl.Environment):
        name = "{name}"

        @classmethod
        def tasks(cls, split="train"):
            return [{{"id": f"{{split}}-{{i}}", "word": w}} for i, w in enumerate(["red", "blue"])]

        async def reset(self, task):
            return f"Say {{task['word']}}."

        @agentrl.tool
        def say(self, word: str) -> str:
            """Say a word.

            Args:
                word: the word.
            """
            self.said = word
            self.finish()
            return "ok"

        async def reward(self, messages):
            return float(getattr(self, "said", None) == self.task["word"]) * ANSWER

        @classmethod
        def reference_solution(cls, task):
            return [("say", {{"word": task["word"]}})]
''')


def write_env(directory: Path) -> tuple[str, str]:
    """An environment module with a unique name (and a neighbour it imports) in ``directory``."""
    stem = f"user_env_{uuid.uuid4().hex[:8]}"
    helper = f"{stem}_helper"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{helper}.py").write_text("ANSWER = 1.0\n")
    (directory / f"{stem}.py").write_text(ENV_SOURCE.format(helper=helper, name=stem))
    return stem, helper


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A working directory that is not on the import path; sys.path is restored afterwards."""
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", os.getcwd())])
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_module_in_the_current_directory_loads(isolated: Path) -> None:
    stem, _ = write_env(isolated)
    cls = load_env(f"{stem}:Echo")
    assert cls.name == stem and load_env(f"{stem}:Echo") is cls


def test_a_file_loads_by_relative_or_absolute_path_and_imports_its_neighbours(isolated: Path) -> None:
    stem, _ = write_env(isolated / "envs")
    (isolated / "sub").mkdir()
    os.chdir(isolated / "sub")
    cls = load_env(f"../envs/{stem}.py:Echo")
    assert cls.name == stem
    assert load_env(f"{isolated}/envs/{stem}.py:Echo") is cls, "one file is one module, however it is named"
    assert canonical_spec(f"../envs/{stem}.py:Echo") == f"{isolated / 'envs' / stem}.py:Echo"
    assert canonical_spec("calc") == "calc" and canonical_spec("pkg.mod:Env") == "pkg.mod:Env"


def test_what_cannot_load_says_what_was_tried_and_the_fix(isolated: Path) -> None:
    stem, _ = write_env(isolated)
    with pytest.raises(UnknownEnvironmentError, match=rf"no module 'nowhere_xyz' in the current directory "
                                                      rf"\({isolated}\).*--env path/to/nowhere_xyz.py:Class"):
        load_env("nowhere_xyz:Env")
    with pytest.raises(UnknownEnvironmentError, match=r"there is no file .*missing\.py \(the path is relative"):
        load_env("missing.py:Env")
    with pytest.raises(UnknownEnvironmentError, match=r"has no attribute 'Ech'\. Environments it defines: Echo"):
        load_env(f"{stem}.py:Ech")
    with pytest.raises(UnknownEnvironmentError, match=r"Path is not a subclass of agentrl\.Environment"):
        load_env("pathlib:Path")
    with pytest.raises(UnknownEnvironmentError, match=r"Did you mean x\.py:ClassName"):
        load_env("x.py")
    (isolated / "broken.py").write_text("import agentrl\n\nclass Env(agentrl.Environment:\n    pass\n")
    with pytest.raises(UnknownEnvironmentError, match=r"running .*broken\.py failed: SyntaxError.*\(broken\.py, line 3\)"):
        load_env("broken.py:Env")
    (isolated / "needs_dep.py").write_text("import not_installed_dep_xyz\n")
    with pytest.raises(UnknownEnvironmentError, match=r"imports 'not_installed_dep_xyz', which is not installed "
                                                      r"\(needs_dep\.py, line 1\)"):
        load_env("needs_dep:Env")
    (isolated / "raises.py").write_text("x = 1\nraise RuntimeError('no config')\n")
    with pytest.raises(UnknownEnvironmentError, match=r"importing 'raises' failed: RuntimeError: no config \(raises\.py, line 2\)"):
        load_env("raises:Env")


def test_a_tool_cannot_be_hidden_by_an_attribute() -> None:
    from agentrl.tools.scaffold import example_env

    env = example_env.ExampleEnv()
    with pytest.raises(AttributeError, match=r"ExampleEnv\.stock is a tool; assigning self\.stock would hide it"):
        env.stock = {}  # type: ignore[method-assign]


def _cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([AGENTRL, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def test_the_agentrl_command_loads_an_env_from_the_users_directory(tmp_path: Path) -> None:
    # each spec form resolves in-process in the tests above; here the console script runs a module and a file
    stem, _ = write_env(tmp_path)
    out = _cli("eval", "--env", f"{stem}:Echo", "--policy", "oracle", cwd=tmp_path)
    assert out.returncode == 0 and json.loads(out.stdout.splitlines()[-1])["success"] == 1.0, out.stderr
    (tmp_path / "sub").mkdir()
    out = _cli("eval", "--env", f"../{stem}.py:Echo", "--policy", "oracle", cwd=tmp_path / "sub")
    assert out.returncode == 0 and json.loads(out.stdout.splitlines()[-1])["success"] == 1.0, out.stderr
    out = _cli("train", "--env", f"../{stem}.py:Echo", "--print-config", cwd=tmp_path / "sub")
    assert out.returncode == 0, out.stderr
    assert f'env = "{tmp_path}/{stem}.py:Echo"' in out.stdout, "a file is recorded by its absolute path"
    assert not out.stdout.startswith("name = ") and "\nname = " not in out.stdout, "named at start, after the env"
    out = _cli("eval", "--env", "../nowhere.py:Echo", "--policy", "oracle", cwd=tmp_path / "sub")
    assert out.returncode == 2 and "Traceback" not in out.stderr and "there is no file" in out.stderr


def test_init_env_writes_an_environment_and_its_tests_once(tmp_path: Path) -> None:
    # the written environment's own tests (the reference solution scores 1, giving up 0) and its evaluation by
    # the console script run as docs/environments.md shows them (tests/docs runs that block as written)
    out = _cli("init-env", "stock_count", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "agentrl eval --env stock_count.py:StockCount --policy oracle" in out.stdout
    assert (tmp_path / "stock_count.py").is_file() and (tmp_path / "test_stock_count.py").is_file()
    again = _cli("init-env", "stock_count", cwd=tmp_path)
    assert again.returncode == 2 and "already exist" in again.stderr
    bad = _cli("init-env", "Stock-Count", cwd=tmp_path)
    assert bad.returncode == 2 and "cannot name an environment" in bad.stderr


def test_serve_env_serves_an_env_file_named_relative_to_the_current_directory(tmp_path: Path) -> None:
    import re
    import signal

    import httpx

    stem, _ = write_env(tmp_path / "envs")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen([AGENTRL, "serve-env", "--env", f"envs/{stem}.py:Echo", "--port", "0", "--no-auth"],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if m := re.search(r"serving (\S+) on (http://\S+)", line):
                break
        else:
            raise AssertionError(f"serve-env exited ({proc.wait()}) without serving")
        assert m.group(1) == stem
        envs = httpx.get(f"{m.group(2)}/v1/envs", timeout=10).json()
        assert [e["name"] for e in envs["envs"]] == [stem]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
