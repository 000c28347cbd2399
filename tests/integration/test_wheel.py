"""The built wheel, installed (not editable) into a fresh virtual environment, is complete: every package and
its data are in it, and the CLI (``init-env``, ``serve-policy``) and every module work from outside the repo.

The dependencies are not installed again: a ``.pth`` file in the new environment names the running
interpreter's site-packages. A plain path line only appends that directory to ``sys.path``; the ``.pth`` files
inside it are not processed, so the development install's editable finder stays inactive and ``agentrl`` can
only come from the wheel (the import check asserts it).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.conftest import require

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ROOTS = {"agentrl": "agentrl/", "envs": "agentrl/envs/", "sandbox": "agentrl/sandbox/"}
"""Source directory → its path inside the wheel (as setup.py maps them)."""

IMPORT_ALL = textwrap.dedent('''
    import importlib, pkgutil, sys
    from pathlib import Path

    import agentrl

    # Data, not a module: the test file init-env copies. (The SWE tasks' small repositories are data too, with no
    # package among them, so the walk never meets them.)
    SKIP = ("agentrl.tools.scaffold.example_env_check",)
    site = Path(sys.argv[1]).resolve()
    seen, outside = [], []

    def check(mod):
        seen.append(mod.__name__)
        if not Path(mod.__file__).resolve().is_relative_to(site):
            outside.append(f"{mod.__name__}: {mod.__file__}")

    def walk(pkg):
        for info in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."):
            if info.name in SKIP:
                continue
            mod = importlib.import_module(info.name)
            check(mod)
            if info.ispkg:
                walk(mod)

    check(agentrl)
    walk(agentrl)
    assert not outside, "imported from outside the new environment: " + "; ".join(outside)
    print("\\n".join(seen))
''')


def _run(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{args} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def _copy_sources(dest: Path) -> None:
    """The repository's top-level files and the three package roots, as a build sees them. setuptools builds in
    the source tree (``build/``, ``*.egg-info``), where stale files from earlier builds would leak into the
    wheel and concurrent runs would collide, so the build runs on this copy."""
    dest.mkdir()
    for f in REPO.iterdir():
        if f.is_file():
            shutil.copy2(f, dest / f.name)
    for root in ROOTS:
        shutil.copytree(REPO / root, dest / root, ignore=shutil.ignore_patterns("__pycache__", ".*", "*.egg-info"))


def _tracked() -> list[str] | None:
    """Files git tracks under the package roots, or None outside a git checkout."""
    if shutil.which("git") is None:
        return None
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", *ROOTS], capture_output=True, text=True)
    return [f for f in out.stdout.split("\0") if f] if out.returncode == 0 else None


def test_wheel_installs_into_a_fresh_venv_and_runs(tmp_path: Path) -> None:
    require(importlib.util.find_spec("pip") is not None, "pip is not installed")
    require(importlib.util.find_spec("setuptools") is not None, "setuptools is not installed (the build has no isolation)")

    # Build: no isolation, no index, and no warning from the backend (pip re-emits each as BuildBackendWarning).
    src, dist = tmp_path / "src", tmp_path / "dist"
    _copy_sources(src)
    build = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                  "-w", str(dist), str(src)], cwd=tmp_path)
    log = build.stdout + build.stderr
    warned = [line for line in log.splitlines() if "Warning" in line]
    assert not warned, f"the build warns: {warned}\n{log}"
    (wheel,) = dist.glob("agentrl-*.whl")

    # Contents: every tracked file under its installed name, and nothing from caches.
    names = {n for n in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in n}
    for must in ("agentrl/http/policy/__init__.py", "agentrl/tools/scaffold/__init__.py", "agentrl/envs/swe/data/tasks.jsonl",
                 "agentrl/sandbox/provision.sh", "agentrl/envs/swe/repos/durations/tests/test_parse.py"):
        assert must in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc") or "/." in n]
    tracked = _tracked()
    if tracked is not None:
        wanted = {ROOTS[f.split("/", 1)[0]] + f.split("/", 1)[1] for f in tracked}
        missing = sorted(wanted - names)
        assert not missing, f"tracked files missing from the wheel: {missing}"

    # A fresh environment that sees the installed dependencies (pip included) but not the development install.
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    py = bin_dir / ("python.exe" if os.name == "nt" else "python")
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=tmp_path).stdout.strip())
    deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "_agentrl_test_deps.pth").write_text("".join(f"{d}\n" for d in deps))
    probe = "import importlib.util as u; print('agentrl:', u.find_spec('agentrl'))"
    assert _run([str(py), "-c", probe], cwd=tmp_path).stdout.strip() == "agentrl: None"  # before the wheel
    # --ignore-installed: the development install's metadata is visible too; pip neither skips the wheel for it
    # nor tries to uninstall it.
    _run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", str(wheel)], cwd=tmp_path)

    # Run from outside the repository, with the installed console script.
    work = tmp_path / "work"
    work.mkdir()
    agentrl = str(bin_dir / "agentrl")
    assert "init-env" in _run([agentrl, "--help"], cwd=work).stdout
    _run([agentrl, "init-env", "myenv"], cwd=work)
    assert (work / "myenv.py").is_file() and (work / "test_myenv.py").is_file()
    assert "class Myenv" in (work / "myenv.py").read_text()
    for command in ("serve-policy", "serve-tinker", "export"):
        assert "--help" in _run([agentrl, command, "--help"], cwd=work).stdout, command
    imported = _run([str(py), "-c", IMPORT_ALL, str(site)], cwd=work, timeout=300).stdout.split()
    for name in ("agentrl.cli", "agentrl.http.policy", "agentrl.tools.scaffold", "agentrl.envs.swe", "agentrl.sandbox",
                 "agentrl.tinker.app", "agentrl.engine.cpu_lora", "agentrl.launch.export"):
        assert name in imported
    assert not [n for n in imported if n.startswith("agentrl.envs.swe.repos")]
    # The SWE environment finds its repositories (package data) inside the installed package.
    swe = "from agentrl.envs.swe.repo import REPOS_DIR, clean_tree; print(REPOS_DIR); print(len(clean_tree('durations')))"
    repos_dir, n_files = _run([str(py), "-c", swe], cwd=work).stdout.split()
    assert Path(repos_dir) == site / "agentrl" / "envs" / "swe" / "repos" and int(n_files) > 0
