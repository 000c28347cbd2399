"""The contract between agentrl's engine side and the installed vLLM: every target that a patch, wrap or lookup
of :mod:`agentrl.engine.vllm_patches` records exists in this vLLM, which is the version they were written for;
the worker extension loads the way vLLM loads it, under its new and its old name, without clashing with vLLM's
worker classes. Imports vLLM's modules (no engine is started)."""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from pathlib import Path
from typing import Any

import pytest

from agentrl.engine import vllm_patches
from agentrl.engine.contract import Target
from agentrl.engine.extension import WorkerExtension  # imported before vLLM: nothing is installed here
from agentrl.engine.version_gate import base_version, running_vllm_version

ENGINE = Path(vllm_patches.__file__).parent


def _assigned(cls: type) -> set[str]:
    """Names ``cls``'s source assigns on ``self`` (``self.x = ...``, ``self.x: T = ...``, ``self.a, self.b =
    ...``) or declares as fields in its body (``x: T``)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    names: set[str] = set()

    def leaves(node: ast.AST) -> list[ast.AST]:
        if isinstance(node, (ast.Tuple, ast.List)):
            return [leaf for elt in node.elts for leaf in leaves(elt)]
        return [node.value] if isinstance(node, ast.Starred) else [node]

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = [leaf for t in node.targets for leaf in leaves(t)]
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        else:
            continue
        names |= {t.attr for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                  and t.value.id == "self"}
    body = tree.body[0]
    assert isinstance(body, ast.ClassDef)
    names |= {s.target.id for s in body.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    return names


def _resolve(target: Target) -> tuple[Any, str]:
    """The object that holds the target's last name, and that name."""
    try:
        obj: Any = importlib.import_module(target.module)
    except ImportError as e:
        if target.optional:
            pytest.skip(f"{target.module} is not in this vLLM build ({e}); the code copes")
        raise
    *owners, last = target.attr.split(".")
    for i, name in enumerate(owners):
        assert hasattr(obj, name), f"{target}: {'.'.join([target.module, *owners[: i + 1]])} is gone"
        obj = getattr(obj, name)
    return obj, last


def test_this_vllm_is_the_one_the_patches_were_written_for() -> None:
    assert base_version(running_vllm_version()) == vllm_patches.WRITTEN_FOR_VLLM


def test_every_use_records_its_version_and_targets() -> None:
    names = [use.name for use in vllm_patches.PRIVATE_USES]
    assert len(names) == len(set(names)) and len(names) >= 15, names
    for use in vllm_patches.PRIVATE_USES:
        assert use.written_for == vllm_patches.WRITTEN_FOR_VLLM and use.targets, use
        assert getattr(vllm_patches, use.name).vllm_use is use
        assert all(t.module.startswith("vllm") for t in use.targets), use


def test_every_function_that_imports_vllm_is_recorded() -> None:
    """The fence: in agentrl.engine only vllm_patches (and the version gate's version read) import vLLM, and
    each of its functions that does carries a record."""
    for path in sorted(ENGINE.glob("*.py")):
        tree = ast.parse(path.read_text())
        imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        mods = {a.name for n in imports if isinstance(n, ast.Import) for a in n.names} | {
            n.module or "" for n in imports if isinstance(n, ast.ImportFrom)}
        touches = sorted(m for m in mods if m.split(".")[0] == "vllm")
        if path.name == "version_gate.py":
            assert touches == ["vllm.version"]
        elif path.name != "vllm_patches.py":
            assert not touches, f"{path.name} imports {touches}: go through agentrl.engine.vllm_patches"
    for node in ast.parse((ENGINE / "vllm_patches.py").read_text()).body:
        if isinstance(node, ast.FunctionDef) and any(
                isinstance(n, ast.ImportFrom) and (n.module or "").startswith("vllm") for n in ast.walk(node)):
            assert hasattr(getattr(vllm_patches, node.name), "vllm_use"), f"{node.name} has no record"


@pytest.mark.parametrize("target", vllm_patches.targets(), ids=str)
def test_target_exists_in_the_installed_vllm(target: Target) -> None:
    owner, name = _resolve(target)
    if not target.instance:
        assert hasattr(owner, name), f"{target} is gone"
        return
    assert inspect.isclass(owner), f"{target}: an instance attribute needs its class"
    assert hasattr(owner, name) or name in _assigned(owner), \
        f"{target}: {owner.__qualname__} no longer has or assigns self.{name}"


def test_vllm_loads_the_extension_by_its_name() -> None:
    from vllm.utils.import_utils import resolve_obj_by_qualname

    assert resolve_obj_by_qualname("agentrl.engine.extension.WorkerExtension") is WorkerExtension


@pytest.mark.parametrize(("module", "cls"), [("vllm.v1.worker.gpu_worker", "Worker"),
                                             ("vllm.v1.worker.cpu_worker", "CPUWorker")])
def test_the_extension_does_not_clash_with_vllms_workers(module: str, cls: str) -> None:
    """vLLM refuses an extension with an attribute its worker class already has (``init_worker``)."""
    worker = getattr(importlib.import_module(module), cls)
    clash = [a for a in dir(WorkerExtension) if not a.startswith("__") and hasattr(worker, a)]
    assert not clash


def test_the_lora_slot_ranks_are_vllms() -> None:
    """``inference.max_lora_rank`` is checked at config time against the slot sizes vLLM accepts; those are
    written in the pure config (it imports no vLLM), so this holds them to the installed vLLM's own list."""
    import typing

    from vllm.config.lora import MaxLoRARanks

    from agentrl.config.inference import ENGINE_LORA_RANKS

    assert ENGINE_LORA_RANKS == typing.get_args(MaxLoRARanks)
