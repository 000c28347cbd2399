"""Every patch of vLLM internals that the in-place LoRA extension (:mod:`agentrl.weight_sync.vllm_ext`) needs.

Written for vLLM 0.32.0 (:data:`WRITTEN_FOR_VLLM`). Everything here reaches past vLLM's public
worker-extension API (private methods and attributes, the call stack), so another vLLM can break it without
an error: :func:`install_patches` logs a one-line warning naming both versions when the running vLLM is not
that version (it installs the patches all the same). Check each item below against the new vLLM's source
before changing :data:`WRITTEN_FOR_VLLM`.

Monkeypatches, installed once per worker process by :func:`install_patches` (:func:`patch_lora_worker_manager`,
:func:`patch_router_tap`, :func:`patch_moe_reload_prepack`):

1. ``vllm.lora.worker_manager.WorkerLoRAManager._load_adapter`` (wrapped): records lora_name ->
   (lora_int_id, lora_path) of every adapter the worker loads, since a worker only sees int ids and the
   publisher names adapters; counts loads from disk (``stats["file_loads"]``).
2. ``LRUCacheWorkerLoRAManager.add_adapter`` (wrapped): times an ``add_adapter`` that read the adapter from
   disk (``stats["last_file_load_ms"]``), for the file-vs-shared-memory benchmark.
3. ``LRUCacheWorkerLoRAManager._apply_adapters`` (wrapped): vLLM 0.32 keeps the ``LoRARequest`` of a
   ``load_inplace`` load and sends it with every later request, and ``add_adapter`` then reloads the adapter
   FROM DISK on every engine step that uses it (``worker_manager.py``: ``... or lora_request.load_inplace``).
   That costs a file read per step and would overwrite in-place updates with the file's weights. The wrapper
   clears ``load_inplace`` on the requests for adapters already loaded, so per-step activation is a plain
   touch; an explicit ``add_lora`` (the HTTP ``load_lora_adapter`` route) still reloads in place.

Private-API lookups (nothing patched; called by the extension when it needs them):

4. :func:`find_engine_core`: walks the call stack (``sys._getframe``) for the in-process
   ``vllm.v1.engine.core.EngineCore`` that called the worker, so the extension can set the weight version and
   reset the prefix cache atomically with the copy. Multi-process workers (vLLM CPU always, GPU with TP>1)
   have none.
5. :func:`lora_adapter_manager`: the worker's ``model_runner.lora_manager._adapter_manager`` (a private
   attribute): the ``LoRAModelManager`` that holds the stacked slot buffers and the CPU adapter cache.

Full-weight loading (:mod:`agentrl.weight_sync.vllm_full`), through vLLM's layerwise reload (public functions of
``vllm.model_executor.model_loader.reload``, the same ones its weight-transfer engines call):

6. :func:`begin_weight_load` / :func:`load_weight_bucket` / :func:`finish_weight_load`: restore each layer's
   checkpoint-format parameters, load buckets through ``model.load_weights`` (which maps q/k/v onto
   ``qkv_proj``, shards for tensor parallelism...), and re-run each layer's weight processing once all its
   weights arrived (on CPU the linear layers hold oneDNN-packed weights, not the checkpoint tensors: a plain
   ``load_weights`` after start-up fails on them). The finish also drops the LoRA state derived from the old
   base weights (``model_runner.reset_lora_state``, as vLLM's ``finish_weight_update`` does), and redoes the
   processing of tied embeddings (:func:`refresh_tied_embeddings`: the trainer sends ``embed_tokens`` once, so
   vLLM never reprocesses ``lm_head``, whose CPU-packed GEMM weights would lag a version behind).
8. :func:`patch_moe_reload_prepack`: wraps ``UnquantizedFusedMoEMethod._setup_kernel``
   (``fused_moe/unquantized_fused_moe_method.py``). On a weight update (``self.moe_kernel`` already built)
   vLLM copies the reloaded checkpoint-layout ``w13_weight`` / ``w2_weight`` into the parameters but skips
   ``moe_kernel.fused_experts.process_weights_after_loading(layer)``, which on CPU
   (``CPUUnquantizedExperts`` in ``fused_moe/experts/cpu_moe.py``) pads the intermediate dim and prepacks
   both tensors into the grouped-GEMM layout (``cpu_prepack_moe_weight``, a permutation, not a no-op). The
   reload thus left unpacked weights where the kernel reads packed ones: every expert wrong (attention
   exact). The wrapper redoes that step on an update for the CPU experts; inside a layerwise reload it runs
   on the layer's temporary tensors, and the packed result is then copied into the served storage.

MoE routing capture (:mod:`agentrl.moe.capture`):

7. :func:`patch_router_tap`: wraps ``GPUModelRunner.load_model`` and ``CPUModelRunner.load_model`` so that,
   once the model is loaded and before vLLM compiles it, every MoE router's capture hook
   (``BaseRouter.set_capture_fn``, vLLM's own hook for its routed-experts capturer) writes its top-k ids into
   one tensor. Set after compilation, the hook would never run on CPU (the MoE layer is traced into the
   graph there, with the hook's ``None`` check evaluated at trace time). The capture itself also wraps the
   runner's private ``_prepare_inputs`` and ``execute_model`` (per instance, when enabled) and reads
   ``input_batch.block_table`` and ``positions``.

This module must import without vLLM (the launcher imports the extension outside a worker): vLLM and
msgspec are imported inside the functions.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from typing import Any

WRITTEN_FOR_VLLM = "0.32.0"
"""The vLLM version these patches were written for and checked against."""

log = logging.getLogger(__name__)


@functools.cache
def check_vllm_version() -> str:
    """The running vLLM's version; logs a one-line warning (once per process) when it is not
    :data:`WRITTEN_FOR_VLLM` (a local build tag such as ``+cpu`` is ignored). Never raises."""
    try:
        from vllm.version import __version__ as running
    except Exception:  # a check only: the patches are tried all the same
        running = "unknown"
    running = str(running)
    if running.split("+", 1)[0] != WRITTEN_FOR_VLLM:
        log.warning("agentrl vLLM patches (agentrl/weight_sync/vllm_patches.py) were written for vLLM %s, "
                    "running vLLM %s: check them", WRITTEN_FOR_VLLM, running)
    return running


def install_patches(registry: dict[str, tuple[int, str]], stats: dict[str, float]) -> None:
    """Install the monkeypatches (1-3, 7, 8; idempotent) in a vLLM worker process, after the version check.

    ``registry`` (lora_name -> (lora_int_id, lora_path)) and ``stats`` (``file_loads``,
    ``last_file_load_ms``) are the extension's dicts, filled by the hooks. Raises when vLLM's layout changed
    (the caller reports it; updates by int id still work)."""
    check_vllm_version()
    patch_lora_worker_manager(registry, stats)
    patch_router_tap()
    patch_moe_reload_prepack()


def patch_moe_reload_prepack() -> None:
    """Patch 8: after vLLM sets up an unquantized MoE layer's weights on a weight update, redo the CPU
    experts' padding and prepacking that vLLM only runs on the first load (see the module docstring).
    Idempotent; nothing on a build without the CPU MoE experts."""
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # pragma: no cover - a build without the CPU experts
        return
    setup = UnquantizedFusedMoEMethod._setup_kernel
    if getattr(setup, "_agentrl_hook", False):
        return

    @functools.wraps(setup)
    def _setup_kernel(self: Any, layer: Any, *args: Any, **kwargs: Any) -> Any:
        update = self.moe_kernel is not None
        out = setup(self, layer, *args, **kwargs)
        experts = getattr(self.moe_kernel, "fused_experts", None)
        if update and isinstance(experts, CPUUnquantizedExperts):
            experts.process_weights_after_loading(layer)
        return out

    _setup_kernel._agentrl_hook = True  # type: ignore[attr-defined]
    UnquantizedFusedMoEMethod._setup_kernel = _setup_kernel  # type: ignore[method-assign]


def patch_router_tap() -> None:
    """Patch 7: after a model runner loads its model (and before vLLM compiles it), tap its MoE routers
    (:class:`agentrl.moe.capture.RouterTap`; nothing for a dense model). Idempotent."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    runners: list[Any] = [GPUModelRunner]
    try:
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner

        runners.append(CPUModelRunner)
    except ImportError:  # a GPU build
        pass
    for cls in runners:
        load = cls.__dict__.get("load_model")
        if load is None or getattr(load, "_agentrl_hook", False):
            continue

        def load_model(self: Any, *args: Any, _load: Any = load, **kwargs: Any) -> Any:
            out = _load(self, *args, **kwargs)
            if getattr(self, "_agentrl_router_tap", None) is None:
                from agentrl.moe.capture import RouterTap

                self._agentrl_router_tap = RouterTap.attach(self)
            return out

        load_model._agentrl_hook = True  # type: ignore[attr-defined]
        cls.load_model = load_model  # type: ignore[method-assign]


def patch_lora_worker_manager(registry: dict[str, tuple[int, str]], stats: dict[str, float]) -> None:
    """Patches 1-3: wrap vLLM's worker LoRA manager (idempotent); see the module docstring."""
    import msgspec
    from vllm.lora.worker_manager import LRUCacheWorkerLoRAManager, WorkerLoRAManager

    load, apply = WorkerLoRAManager._load_adapter, LRUCacheWorkerLoRAManager._apply_adapters
    add = LRUCacheWorkerLoRAManager.add_adapter
    if getattr(load, "_agentrl_hook", False):
        return

    def _load_adapter(self: Any, lora_request: Any) -> Any:
        lora = load(self, lora_request)
        registry[lora_request.lora_name] = (int(lora_request.lora_int_id), str(lora_request.lora_path))
        stats["file_loads"] += 1
        return lora

    def _add_adapter(self: Any, lora_request: Any) -> bool:
        t0, n = time.perf_counter(), stats["file_loads"]
        out = add(self, lora_request)
        if stats["file_loads"] != n:  # read from disk, built, swapped into its slot
            stats["last_file_load_ms"] = (time.perf_counter() - t0) * 1e3
        return out

    def _apply_adapters(self: Any, lora_requests: set[Any]) -> None:
        loaded = self.list_adapters()
        apply(self, {msgspec.structs.replace(r, load_inplace=False)
                     if r and r.load_inplace and r.lora_int_id in loaded else r for r in lora_requests})

    _load_adapter._agentrl_hook = True  # type: ignore[attr-defined]
    WorkerLoRAManager._load_adapter = _load_adapter  # type: ignore[method-assign]
    LRUCacheWorkerLoRAManager._apply_adapters = _apply_adapters  # type: ignore[method-assign]
    LRUCacheWorkerLoRAManager.add_adapter = _add_adapter  # type: ignore[method-assign]


def find_engine_core() -> Any:
    """Patch 4: the ``EngineCore`` among the callers of this function's caller (an in-process executor), or
    None. The walk starts at the caller, whose own ``self`` is never an ``EngineCore``."""
    from vllm.v1.engine.core import EngineCore

    frame = sys._getframe(1)
    while frame is not None:
        obj = frame.f_locals.get("self")
        if isinstance(obj, EngineCore):
            return obj
        frame = frame.f_back
    return None


def lora_adapter_manager(worker: Any) -> Any:
    """Patch 5: the worker's ``LoRAModelManager`` (``model_runner.lora_manager._adapter_manager``), or None
    when LoRA is not enabled."""
    runner = getattr(worker, "model_runner", None)
    return getattr(getattr(runner, "lora_manager", None), "_adapter_manager", None)


def served_model(worker: Any) -> Any:
    """The ``nn.Module`` a vLLM worker serves (``model_runner.get_model()``, or ``.model`` on older runners)."""
    runner = worker.model_runner
    return runner.get_model() if hasattr(runner, "get_model") else runner.model


def begin_weight_load(worker: Any) -> None:
    """Patch 6a: prepare every layer of ``worker``'s model to receive checkpoint-format weights."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

    with set_current_vllm_config(worker.vllm_config):
        initialize_layerwise_reload(served_model(worker))


def load_weight_bucket(worker: Any, weights: Any) -> None:
    """Patch 6b: load ``(name, tensor)`` pairs (Hugging Face names) between begin and finish."""
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(worker.vllm_config):
        served_model(worker).load_weights(weights)


def finish_weight_load(worker: Any) -> None:
    """Patch 6c: process the layers that were not processed on the fly and drop derived LoRA state."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

    with set_current_vllm_config(worker.vllm_config):
        model = served_model(worker)
        finalize_layerwise_reload(model, worker.vllm_config.model_config)
        refresh_tied_embeddings(model)
    reset = getattr(worker.model_runner, "reset_lora_state", None)
    if reset is not None:
        reset()


def refresh_tied_embeddings(model: Any) -> int:
    """Redo the weight processing of embedding layers that share their weight with another one (tied input
    and output embeddings: ``lm_head`` is ``embed_tokens``). The trainer has one parameter for both, so a load
    reaches only one of the layers; the other is never reprocessed and keeps state derived from the previous
    weights (the CPU backend's packed GEMM weights of ``lm_head``: the logits would lag a version behind).
    Returns the number of layers redone."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    groups: dict[int, list[Any]] = {}
    for module in model.modules():
        weight = module._parameters.get("weight")
        if weight is not None and isinstance(getattr(module, "quant_method", None), UnquantizedEmbeddingMethod):
            groups.setdefault(id(weight), []).append(module)
    tied = [m for group in groups.values() if len(group) > 1 for m in group]
    for module in tied:
        module.quant_method.process_weights_after_loading(module)
    return len(tied)
