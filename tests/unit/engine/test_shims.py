"""The old import paths of what moved into :mod:`agentrl.engine` re-export the same objects and define nothing;
one extension class, whose old name is an alias; the engine package imports without vLLM and torch."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.config.inference import VLLMServerConfig

ROOT = Path(__file__).resolve().parents[3]
SHIMS = {
    "agentrl.inference.lora_ext": {"LoRAInPlaceExtension": "agentrl.engine.extension.WorkerExtension",
                                   "WorkerExtension": "agentrl.engine.extension.WorkerExtension"},
}


def _obj(qualname: str) -> object:
    module, _, name = qualname.rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("old", sorted(SHIMS))
def test_old_paths_re_export_the_same_objects(old: str) -> None:
    module = importlib.import_module(old)
    assert sorted(module.__all__) == sorted(SHIMS[old])
    for name, new in SHIMS[old].items():
        assert getattr(module, name) is _obj(new), f"{old}.{name}"


@pytest.mark.parametrize("old", sorted(SHIMS))
def test_shims_define_nothing(old: str) -> None:
    """A docstring, imports from agentrl.engine, ``__all__``, and aliases (``Old = New``) with their docstring."""
    path = ROOT / (old.replace(".", "/") + ".py")
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("agentrl.engine"):
            continue
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and (
                isinstance(node.value, ast.Name) or node.targets[0].id == "__all__"):
            continue
        raise AssertionError(f"{old}:{node.lineno}: {ast.unparse(node)}")


def test_one_extension_class_and_the_config_names_it() -> None:
    classes = [p for p in (ROOT / "agentrl").rglob("*.py")
               for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.ClassDef)
               and n.name in ("LoRAInPlaceExtension", "WorkerExtension")]
    assert [p.relative_to(ROOT).as_posix() for p in classes] == ["agentrl/engine/extension.py"]
    assert VLLMServerConfig(model="m").worker_extension == "agentrl.engine.extension.WorkerExtension"


def test_the_engine_package_imports_without_vllm_and_torch() -> None:
    """The launcher imports the extension (old and new names) to check it, in a process without vLLM."""
    code = ("import sys\n"
            "class Block:\n"  # any import of vllm or torch fails
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('vllm', 'torch'):\n"
            "            raise ImportError(name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "import agentrl.engine, agentrl.engine.extension, agentrl.engine.capture, agentrl.engine.contract\n"
            "import agentrl.inference.lora_ext\n"
            "assert agentrl.engine.install.OUTCOME.attempted is False\n"
            "assert not {'vllm', 'torch'} & set(sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
