"""The plan of a LoRA adapter merged into the base weights, in the worker (the ``merged`` transport's engine
half, :mod:`agentrl.engine.transports.merged`, runs it): the engine recomputes ``W0 + scaling * B @ A`` for every
module the adapter touches from a kept copy of the base weights, so generation runs on plain weights (vLLM's
LoRA kernels cost the CPU build 2 to 3.5x of its generation speed).

The merged modules are loaded with vLLM's own weight loading (:mod:`agentrl.engine.transports.full`): q/k/v
map onto ``qkv_proj`` and each layer's weight processing is redone (on CPU, the oneDNN-packed GEMM weights). Every layer the update reaches gets all
of its tensors: the touched modules' siblings in a packed layer and their biases come from the kept copy.
The kept copy is read once from the served checkpoint: the touched modules' tensors only.

The publisher pauses the engine (``keep``) around the call and labels the version, resets the prefix cache
and resumes it after (:class:`agentrl.weight_sync.merged.MergedAdapterSync`), as for full weights.

This module must import without vLLM and torch (the launcher imports the extension to check it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agentrl.engine.adapter_plan import UpdateError


class Checkpoint:
    """The served model's tensors by Hugging Face name, read lazily from its safetensors files."""

    def __init__(self, model_dir: str) -> None:
        files = sorted(Path(model_dir).glob("*.safetensors"))
        if not files:
            raise UpdateError(f"merged LoRA serving reads the base weights from the served checkpoint: no "
                              f"safetensors files in {model_dir!r} (serve a local model directory)")
        from safetensors import safe_open

        self.where: dict[str, Path] = {}
        for f in files:
            with safe_open(str(f), framework="pt") as fh:
                self.where.update(dict.fromkeys(fh.keys(), f))

    def names(self, prefix: str) -> list[str]:
        """The tensor names under module ``prefix`` (its ``weight``, its ``bias``...)."""
        return sorted(n for n in self.where if n.startswith(prefix + ".") and "." not in n[len(prefix) + 1:])

    def read(self, names: list[str]) -> dict[str, Any]:
        """The tensors ``names``, each file opened once."""
        from safetensors import safe_open

        out: dict[str, Any] = {}
        by_file: dict[Path, list[str]] = {}
        for n in names:
            by_file.setdefault(self.where[n], []).append(n)
        for f, group in by_file.items():
            with safe_open(str(f), framework="pt") as fh:
                out.update({n: fh.get_tensor(n) for n in group})
        return out


class MergePlan:
    """For one adapter layout: each published tensor's merged value, from the kept base and the adapter's
    A and B views (into the shared segment or the call's buffer)."""

    def __init__(self) -> None:
        self.names: list[str] = []          # Hugging Face names fed to load_weights, in checkpoint order
        self.base: dict[str, Any] = {}      # name -> kept base tensor (the served dtype)
        self.work: dict[str, Any] = {}      # name -> merged tensor, rewritten each sync
        self.terms: dict[str, tuple[Any, Any, float]] = {}  # weight name -> (B, A, scaling)
        self.whole: dict[str, Any] = {}     # name -> a tensor the adapter carries whole (a trained norm)

    def merged(self) -> Iterator[tuple[str, Any]]:
        """Every tensor of the plan, merged now: ``W0 + scaling * B @ A`` for the adapter's modules, the
        adapter's own value for a tensor it carries whole."""
        import torch

        for name in self.names:
            if name in self.whole:
                out = self.work[name]
                out.copy_(self.whole[name])
                yield name, out
                continue
            term = self.terms.get(name)
            if term is None:
                yield name, self.base[name]
                continue
            b, a, scale = term
            out = self.work[name]
            if out.dtype == torch.float32:
                torch.addmm(self.base[name], b.float(), a.float(), alpha=scale, out=out)
            else:  # accumulate in float32, round once
                out.copy_(torch.addmm(self.base[name].float(), b.float(), a.float(), alpha=scale))
            yield name, out


def lora_module(name: str) -> tuple[str, bool]:
    """A peft tensor name's module (Hugging Face name) and whether it is ``lora_A``:
    ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` -> ``(model.layers.0.self_attn.q_proj,
    True)``."""
    module, sep, rest = name.removeprefix("base_model.model.").rpartition(".lora_")
    if not sep or rest not in ("A.weight", "B.weight"):
        raise UpdateError(f"{name}: not a LoRA tensor name (<module>.lora_A.weight or <module>.lora_B.weight)")
    return module, rest == "A.weight"


def build_merge_plan(meta: dict[str, Any], buf: Any, packed: dict[str, list[str]], checkpoint: Checkpoint,
                     kept: dict[str, Any], dtype: Any, scaling: Callable[[str], float]) -> MergePlan:
    """The plan for the adapter tensors of ``meta`` in ``buf``. ``packed``: the model's packed modules (vLLM's
    ``packed_modules_mapping``, e.g. ``qkv_proj: [q_proj, k_proj, v_proj]``); ``kept``: base tensors already
    read (shared across plans: read once per engine); ``dtype``: the served dtype; ``scaling(module)``: the
    factor of ``B @ A`` for a module (peft's ``alpha / r``, per-module patterns and rsLoRA included)."""
    import torch

    from agentrl.weight_sync.inplace import layout_views

    views = dict(zip((n for n, *_ in meta["tensors"]), layout_views(buf, meta["tensors"]), strict=True))
    pairs: dict[str, dict[bool, Any]] = {}
    whole: dict[str, Any] = {}
    for name, view in views.items():
        if ".lora_" not in name:  # trained whole beside the adapter (peft's modules_to_save): a norm
            whole[name.removeprefix("base_model.model.")] = view
            continue
        module, is_a = lora_module(name)
        pairs.setdefault(module, {})[is_a] = view
    sibling_of = {leaf: group for group in packed.values() for leaf in group}
    modules: dict[str, None] = {}
    for module, ab in pairs.items():
        if set(ab) != {True, False}:
            raise UpdateError(f"{module}: the adapter has {'lora_A' if True in ab else 'lora_B'} only")
        parent, _, leaf = module.rpartition(".")
        for sib in sibling_of.get(leaf, [leaf]):
            modules[f"{parent}.{sib}" if parent else sib] = None
    plan = MergePlan()
    for module in modules:
        names = checkpoint.names(module)
        if f"{module}.weight" not in names:
            raise UpdateError(f"{module}: the served checkpoint has no {module}.weight")
        plan.names += names
    for name in whole:
        if name not in checkpoint.where:
            raise UpdateError(f"{name}: the adapter carries it whole, but the served checkpoint has no such tensor")
        if name not in plan.names:
            plan.names.append(name)
    missing = [n for n in plan.names if n not in kept]
    kept.update({n: t.to(dtype).contiguous() for n, t in checkpoint.read(missing).items()})
    for n in plan.names:
        plan.base[n] = kept[n]
    for module, ab in pairs.items():
        name = f"{module}.weight"
        b, a = ab[False], ab[True]
        w0 = plan.base[name]
        if list(w0.shape) != [b.shape[0], a.shape[1]] or b.shape[1] != a.shape[0]:
            raise UpdateError(f"{module}: B {list(b.shape)} @ A {list(a.shape)} does not fit the base weight "
                              f"{list(w0.shape)}")
        plan.terms[name] = (b, a, float(scaling(module)))
        plan.work[name] = torch.empty_like(w0)
    for name, view in whole.items():
        if list(view.shape) != list(plan.base[name].shape):
            raise UpdateError(f"{name}: the adapter's {list(view.shape)} does not fit the served "
                              f"{list(plan.base[name].shape)}")
        plan.whole[name] = view
        plan.work[name] = torch.empty_like(plan.base[name])
    return plan
