"""agentrl's CPU LoRA kernel (``native/lora_cpu.cpp``): built once at install time, loaded by engines if built.

Without it the CPU fast path (:mod:`agentrl.engine.cpu_lora`) serves each LoRA layer with torch ops, two to a
dozen per layer (a gather, batched GEMMs, a scatter-add where several slots share a step): on a small model's
decode steps their dispatch, not their arithmetic, is the cost (16 adapters on the embedded model: 0.67 of the
base). The kernel does a whole LoRA layer (every slice, every slot group, one group or several) in one call,
single-threaded, its 16 x 16 weight tiles transposed in AVX-512 registers; the torch ops remain the fallback (no
compiler at install, a rank off its vector path, another dtype, a large prefill step that two threads serve
better) and the reference its test compares with.

``make install`` runs ``python -m agentrl.engine.native_lora build``: it compiles the source with torch's
extension builder into ``<venv>/agentrl-native/<name>/`` where ``name`` hashes the source, the flags, the torch
and Python versions and the machine, so a changed source or a moved venv builds anew and a stale build is never
loaded. Engines only load (:func:`kernel`): a missing build means the torch path, never a compile inside an
engine. ``AGENTRL_CPU_LORA_NATIVE=0`` in an engine's environment keeps the torch path (to compare).

This module must import without torch (imported inside the functions).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import platform
import sys
from pathlib import Path
from typing import Any

from agentrl.core.errors import EngineError

SOURCE = Path(__file__).with_name("native") / "lora_cpu.cpp"
FLAGS = ("-O3", "-fopenmp", "-march=native")
"""Compiler flags: ``-march=native`` is why the build is keyed by the machine (:func:`build_name`); ``-fopenmp``
links ``libgomp.so.1``, which resolves to the copy torch loaded first: one OpenMP runtime, the engine's pinned
threads."""
ENV_SWITCH = "AGENTRL_CPU_LORA_NATIVE"
"""``0`` in the engine's environment keeps the torch ops (for comparison)."""
DIR_ENV = "AGENTRL_NATIVE_DIR"
"""Overrides where builds live (default: ``agentrl-native`` in the Python environment's prefix)."""


def enabled(environ: dict[str, str] | None = None) -> bool:
    """Whether the kernel is wanted in this process (``AGENTRL_CPU_LORA_NATIVE`` is not ``0``)."""
    from agentrl.engine.cpu_lora import switch_on

    return switch_on(ENV_SWITCH, environ)


def build_root() -> Path:
    """Where builds live: ``$AGENTRL_NATIVE_DIR``, else ``<sys.prefix>/agentrl-native``."""
    return Path(os.environ.get(DIR_ENV) or Path(sys.prefix) / "agentrl-native")


def _machine() -> str:
    """The CPU the build targets (``-march=native``): its model name and flags, as the kernel reports them."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    keep = [ln for ln in text.splitlines() if ln.split(":")[0].strip() in ("model name", "flags", "Features")]
    return platform.machine() + "\n" + "\n".join(dict.fromkeys(keep))


def build_name() -> str:
    """The build's module name: the source, flags, torch and Python versions and the machine, hashed."""
    import torch

    h = hashlib.sha256(SOURCE.read_bytes())
    for part in (*FLAGS, torch.__version__, sys.version, _machine()):
        h.update(b"\0" + part.encode())
    return f"agentrl_lora_cpu_{h.hexdigest()[:12]}"


class KernelBuildError(EngineError, RuntimeError):
    """The kernel's build finished without a library to load."""

    code = "inference.cpu_lora_kernel_build"


def _built(name: str) -> Path | None:
    found = sorted((build_root() / name).glob(f"{name}*.so"))
    return found[0] if found else None


def build(verbose: bool = False) -> Path:
    """Compile the kernel if this source, torch and machine have no build yet; the built library's path."""
    from torch.utils.cpp_extension import load

    name = build_name()
    if (done := _built(name)) is not None:
        return done
    out = build_root() / name
    out.mkdir(parents=True, exist_ok=True)
    load(name=name, sources=[str(SOURCE)], extra_cflags=list(FLAGS), extra_ldflags=["-fopenmp"],
         build_directory=str(out), verbose=verbose)
    done = _built(name)
    if done is None:
        raise KernelBuildError(f"the kernel's build left no library in {out}")
    return done


@functools.lru_cache(maxsize=1)
def kernel() -> Any:
    """The loaded kernel module (its ``lora_groups``), or None: switched off, not built, or not loadable.
    Never compiles."""
    if not enabled():
        return None
    try:
        import torch  # noqa: F401  (the library links against torch's)

        name = build_name()
        path = _built(name)
        if path is None:
            return None
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except (ImportError, OSError, RuntimeError):
        return None


def tile() -> int:
    """The rank multiple the loaded kernel's vector path takes (16 with AVX-512); 0: no kernel, or one built
    with its plain loops only, which the torch ops beat (engines then keep those)."""
    k = kernel()
    return int(k.tile()) if k is not None and hasattr(k, "tile") else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m agentrl.engine.native_lora build``: build (or find) the kernel; it never fails the install,
    since engines fall back to torch ops: a failed build is printed with the reason."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] != ["build"]:
        print("usage: python -m agentrl.engine.native_lora build [--verbose]", file=sys.stderr)
        return 2
    try:
        path = build(verbose="--verbose" in args)
    except Exception as exc:  # a compiler's failure of any kind: reported, torch ops serve
        print(f"agentrl: the CPU LoRA kernel was not built ({type(exc).__name__}: {exc}); engines serve "
              "several LoRA slots with torch ops instead", file=sys.stderr)
        return 0
    print(f"agentrl: CPU LoRA kernel ready: {path.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
