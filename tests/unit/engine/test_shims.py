"""One extension class, which the config names; the engine package imports without vLLM and torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from agentrl.config.inference import VLLMServerConfig

ROOT = Path(__file__).resolve().parents[3]


def test_one_extension_class_and_the_config_names_it() -> None:
    classes = [p for p in (ROOT / "agentrl").rglob("*.py")
               for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.ClassDef)
               and n.name == "WorkerExtension"]
    assert [p.relative_to(ROOT).as_posix() for p in classes] == ["agentrl/engine/extension.py"]
    assert VLLMServerConfig(model="m").worker_extension == "agentrl.engine.extension.WorkerExtension"


def test_the_engine_package_imports_without_vllm_and_torch() -> None:
    """The launcher imports the extension to check it, in a process without vLLM."""
    code = ("import sys\n"
            "class Block:\n"  # any import of vllm or torch fails
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('vllm', 'torch'):\n"
            "            raise ImportError(name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "import agentrl.engine, agentrl.engine.extension, agentrl.engine.capture, agentrl.engine.contract\n"
            "assert agentrl.engine.install.OUTCOME.attempted is False\n"
            "assert not {'vllm', 'torch'} & set(sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
