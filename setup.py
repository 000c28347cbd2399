"""Packaging: the package list is computed from the tree, never written by hand.

``agentrl/`` is installed as ``agentrl``; the bundled environments (``envs/``) and the sandbox
(``sandbox/``) live at the top level of the repository and are installed as ``agentrl.envs`` and
``agentrl.sandbox``. Every directory under the three roots is a package (data directories such as the sandbox
image recipe included, so setuptools has nothing to warn about), and every file in it that is not Python
source is its package data. The SWE tasks' small repositories (``envs/swe/repos/``) are task data, not
modules of agentrl: every file under that directory, their Python sources and tests included, is package
data of ``agentrl.envs.swe``, and none of its directories is a package. Hidden files and directories,
``__pycache__`` and ``*.egg-info`` are never packaged.
"""

import warnings
from pathlib import Path

from setuptools import setup
from setuptools.warnings import InformationOnly

# setuptools ends every editable install (``make install``) with an "Editable installation" notice
# about same-named folders in the working directory; it says nothing about this project, so it is
# silenced (pip prints every warning the build emits). Every other warning still shows.
warnings.filterwarnings("ignore", message="Editable installation", category=InformationOnly)

ROOTS = {"agentrl": "agentrl", "agentrl.envs": "envs", "agentrl.sandbox": "sandbox"}
"""Installed package name → source directory, relative to this file."""
DATA_TREES = {"envs/swe/repos": "agentrl.envs.swe"}
"""A directory (relative to this file) whose whole tree is package data of the package that holds it."""
HERE = Path(__file__).parent


def _skipped(rel: Path) -> bool:
    return any(p == "__pycache__" or p.startswith(".") or p.endswith(".egg-info") for p in rel.parts)


def _tree() -> tuple[list[str], dict[str, list[str]]]:
    packages: list[str] = []
    package_data: dict[str, list[str]] = {}
    data_trees = [HERE / t for t in DATA_TREES]
    for name, root in ROOTS.items():
        base = HERE / root
        for d in sorted([base, *(p for p in base.rglob("*") if p.is_dir())]):
            rel = d.relative_to(base)
            if _skipped(rel) or any(d == t or t in d.parents for t in data_trees):
                continue
            pkg = ".".join((name, *rel.parts))
            packages.append(pkg)
            data = sorted(f.name for f in d.iterdir()
                          if f.is_file() and not f.name.startswith(".") and f.suffix not in {".py", ".pyc", ".pyo"})
            if data:
                package_data[pkg] = data
    for tree, pkg in DATA_TREES.items():
        holder = (HERE / tree).parent
        package_data.setdefault(pkg, []).extend(sorted(
            f.relative_to(holder).as_posix() for f in (HERE / tree).rglob("*")
            if f.is_file() and not _skipped(f.relative_to(holder)) and f.suffix not in {".pyc", ".pyo"}))
    return packages, package_data


_packages, _package_data = _tree()
# Every file to install is listed above: ``include_package_data`` (on by default with a pyproject.toml) would only
# add the same files again, from the build's file manifest, and warn that the repositories' directories look like
# packages that ``packages`` leaves out.
setup(packages=_packages, package_dir=ROOTS, package_data=_package_data, include_package_data=False)
