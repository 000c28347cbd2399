"""The layering of ``agentrl``'s packages, enforced: each package imports only from packages on lower layers
(at module level, inside functions, and under ``TYPE_CHECKING`` alike), so there are no circles and no
imports that run back up. ``docs/architecture.md`` draws the same order; this test is what keeps it true.

The root package ``agentrl`` is a facade (``__version__`` and lazily imported names): any module may import
it, and it imports nothing at run time."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# bottom first; a package may import any package of a lower line, none of its own line or above
LAYERS: list[set[str]] = [
    {"core", "core.errors", "tools", "http", "tools.install"},  # (``core`` and ``tools`` hold only a docstring)
    {"core.masks"},  # the sampling-mask encoding, which the trajectory types carry
    {"core.types", "core.utils", "core.shape", "http.base", "moe"},  # the contracts, small helpers
    {"config"},  # pure config (its resolution reads a model's MoE shape)
    {"core.versions", "sandbox"},
    {"environment", "weight_sync", "tracking"},
    {"engine"},  # what runs inside the vLLM engine: the worker extension and every vLLM patch
    {"inference", "trainer"},
    {"rollout"},
    {"envs", "tools.scaffold"},
    {"launch"},
    {"tools.modelgen"},
    {"http.policy", "http.server", "tinker"},  # the HTTP front ends (tinker: the Tinker API server)
    {"orchestrator"},
    {"tools.bench"},
    {"cli"},
]
GROUPS = {"core", "tools", "http"}
"""Packages that group others: each sub-package (or module) listed in LAYERS as ``group.name`` is a unit of
its own; the group's other modules form the unit ``group.base`` (``http``'s shared parts: auth, limits, TLS)."""
SOURCES = {"agentrl": ROOT / "agentrl", "envs": ROOT / "envs", "sandbox": ROOT / "sandbox"}
SKIP = ("envs/swe/repos/",)  # the SWE tasks' sample repositories: task data


def _layer_of() -> dict[str, int]:
    return {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def _package(module: str) -> str | None:
    """The layering unit ``module`` belongs to (``agentrl.rollout.chat`` -> ``rollout``,
    ``agentrl.core.types`` -> ``core.types``, ``agentrl.http.auth`` -> ``http.base``); None outside."""
    parts = module.split(".")
    if parts[0] != "agentrl" or len(parts) < 2:
        return None
    if parts[1] not in GROUPS or len(parts) == 2:
        return parts[1]
    sub = f"{parts[1]}.{parts[2]}"
    return sub if sub in _layer_of() else f"{parts[1]}.base"


def _imports(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, imported module) for every import in ``path`` (relative imports resolved against ``module``)."""
    found: list[tuple[int, str]] = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found += [(node.lineno, f"{target}.{a.name}") for a in node.names]
    return found


def _modules() -> list[tuple[str, str, Path]]:
    """(package, module name, path) for every source file of agentrl, agentrl.envs and agentrl.sandbox."""
    out = []
    for top, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(ROOT)
            if str(rel).startswith(SKIP):
                continue
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if top == "agentrl":
                name = ".".join(["agentrl", *parts])
                pkg = "" if parts == ["__init__"] else _package(name.removesuffix(".__init__")) or ""
            else:
                pkg, name = top, ".".join(["agentrl", top, *parts])
            out.append((pkg, name.removesuffix(".__init__"), path))
    return out


def upward_imports() -> list[str]:
    layer = _layer_of()
    bad = []
    for pkg, name, path in _modules():
        if not pkg:  # the root facade: checked below
            continue
        for line, target in _imports(path, name):
            other = _package(target)
            if other is None or other == pkg or other == "__version__":
                continue
            if layer[other] >= layer[pkg]:
                bad.append(f"{path.relative_to(ROOT)}:{line} {pkg} (layer {layer[pkg]}) imports {target} "
                           f"({other}, layer {layer[other]})")
    return bad


def test_every_package_has_a_layer() -> None:
    found = {pkg for pkg, _, _ in _modules() if pkg}
    assert found == set(_layer_of()), f"add to LAYERS: {sorted(found - set(_layer_of()))}; " \
                                      f"gone: {sorted(set(_layer_of()) - found)}"


def test_no_import_runs_back_up() -> None:
    bad = upward_imports()
    assert not bad, "imports that run back up (or across one layer):\n" + "\n".join(bad)


def test_the_root_package_imports_nothing_at_run_time() -> None:
    tree = ast.parse((ROOT / "agentrl" / "__init__.py").read_text())
    eager = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
             and any((a.name if isinstance(n, ast.Import) else n.module or "").startswith("agentrl")
                     for a in n.names)]
    assert not eager, [ast.unparse(n) for n in eager]


def test_the_check_sees_an_import_that_runs_up(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("from agentrl.orchestrator.run import TrainingRun\n"
                   "def f():\n    from ..inference import client\n")
    found = _imports(src, "agentrl.rollout.m")
    assert found == [(1, "agentrl.orchestrator.run.TrainingRun"), (3, "agentrl.inference.client")]
    layer = _layer_of()
    assert layer["orchestrator"] > layer["rollout"] > layer["inference"]


def test_the_top_level_holds_at_most_17_entries() -> None:
    entries = sorted(p.name for p in (ROOT / "agentrl").iterdir()
                     if p.name != "__pycache__" and not p.name.startswith("."))
    assert len(entries) <= 17, entries  # 16, and tinker/: the Tinker API server (its own front end)
