"""Every use of vLLM's private API by agentrl's engine side: the monkeypatches, the per-instance wraps, and the
lookups of private state, each recorded as data (:data:`PRIVATE_USES`: the vLLM version it was written for and
the targets it touches, checked against the installed vLLM by ``tests/unit/engine/test_vllm_contract.py``).

Written for vLLM 0.32.0 (:data:`WRITTEN_FOR_VLLM`). Everything here reaches past vLLM's public worker-extension
API (private methods and attributes, the call stack), so another vLLM can break it without an error:
:func:`install_patches` refuses to install anything into another version (a local build tag such as ``+cpu`` is
ignored) unless the engine's environment sets ``AGENTRL_ALLOW_VLLM_VERSION`` to the running version or to
``any`` (:mod:`agentrl.engine.version_gate`). Check each item below against the new vLLM's source (and run the
contract test) before changing :data:`WRITTEN_FOR_VLLM`.

Monkeypatches, installed once per worker process by :func:`install_patches`:

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
14. :func:`patch_lora_slot_release` (wrapped): ``LoRAModelManager._deactivate_adapter``, through which every
   release of an adapter's slot goes (an LRU eviction, ``deactivate_adapter``, ``remove_adapter``), first hands
   the manager and the adapter's id to agentrl: an in-place update writes only the live slot and copies it
   into the adapter's CPU copy (from which vLLM refills a slot) when the slot is released, not at every update.
15. :func:`patch_cpu_seeded_chunks`: vLLM's model runner rewinds the generator of a seeded request whose
   sampled token it discards (a prefill split between engine steps) with ``gen.set_offset(gen.get_offset() -
   4)`` in ``_bookkeeping_sync``. That is CUDA's Philox offset; a CPU generator has none and raises
   ``RuntimeError: CPU Generator does not use offset``, which kills the engine (``EngineDeadError``): one seeded
   request whose prompt did not fit the step's token budget, or many seeded requests arriving together, took
   the CPU build down. On ``CPUModelRunner`` only, ``_sample`` keeps those generators' states and puts them back
   once it has sampled (an exact rewind: the seeded stream does not depend on how the prefill was split), and
   ``_bookkeeping_sync`` runs without them, so vLLM's offset rewind never sees a CPU generator.
17. :func:`patch_cpu_lora_fast_path` (CPU build only; off with ``AGENTRL_CPU_LORA_FAST=0``): wraps
   ``PunicaWrapperCPU.update_metadata`` (the step's per-token slot ids, ``token_lora_indices``, and per-sample
   ones, ``sampler_indices``, grouped by slot once per step) and replaces its ``add_lora_linear``,
   ``add_shrink``, ``add_expand`` and ``add_lora_logits`` (the output layer's LoRA) with plain and batched GEMMs
   on the same stacked slot tensors (:mod:`agentrl.engine.cpu_lora`, which says where vLLM's
   torch ops lose their time); a call that does not fit runs vLLM's own op.
18. :func:`patch_lora_removal` (wrapped): ``LoRAModelManager.deactivate_adapter``, which vLLM calls only when an
   adapter leaves the manager (``remove_adapter``: an unload or a reload from its file; an eviction from the
   CPU cache of adapters, whose callback it is), first hands the manager and the adapter's id to agentrl: the
   adapter forgets its own weight label (:mod:`agentrl.engine.adapter_labels`). Installed before any manager is
   built: the CPU cache keeps the bound method it was built with.
7. :func:`patch_router_tap`: wraps ``GPUModelRunner.load_model`` and ``CPUModelRunner.load_model`` so that,
   once the model is loaded and before vLLM compiles it, every MoE router's capture hook
   (``BaseRouter.set_capture_fn``, vLLM's own hook for its routed-experts capturer) writes its top-k ids into
   one tensor (:func:`tap_moe_routers`). Set after compilation, the hook would never run on CPU (the MoE layer
   is traced into the graph there, with the hook's ``None`` check evaluated at trace time).
8. :func:`patch_moe_reload_prepack`: wraps ``UnquantizedFusedMoEMethod._setup_kernel``
   (``fused_moe/unquantized_fused_moe_method.py``). On a weight update (``self.moe_kernel`` already built)
   vLLM copies the reloaded checkpoint-layout ``w13_weight`` / ``w2_weight`` into the parameters but skips
   ``moe_kernel.fused_experts.process_weights_after_loading(layer)``, which on CPU
   (``CPUUnquantizedExperts`` in ``fused_moe/experts/cpu_moe.py``) pads the intermediate dim and prepacks
   both tensors into the grouped-GEMM layout (``cpu_prepack_moe_weight``, a permutation, not a no-op). The
   reload thus left unpacked weights where the kernel reads packed ones: every expert wrong (attention
   exact). The wrapper redoes that step on an update for the CPU experts; inside a layerwise reload it runs
   on the layer's temporary tensors, and the packed result is then copied into the served storage.

Per-instance wraps (when routing capture is enabled, :mod:`agentrl.engine.capture`):

9. :func:`wrap_runner_step`: replaces one model runner's private ``_prepare_inputs`` and its ``execute_model``
   to learn each step's token layout (:func:`step_layout` reads ``input_batch.block_table`` and ``positions``)
   and to hand the step's routing out once the forward pass has run.
16. :func:`wrap_sampler` (when sampling-mask capture is enabled, :mod:`agentrl.engine.masks`): replaces one
   model runner's ``sampler.sample`` to see the processed logprobs of every row it sampled, read with
   :func:`sampled_rows` (``input_batch.req_ids`` and ``discard_request_mask``) and :func:`logprobs_mode`.

Private-API lookups (nothing patched; called by the extension when it needs them):

4. :func:`find_engine_core`: walks the call stack (``sys._getframe``) for the in-process
   ``vllm.v1.engine.core.EngineCore`` that called the worker, so the extension can set the weight version and
   reset the prefix cache atomically with the copy. Workers in processes of their own (tensor parallelism, or
   the ``mp`` backend chosen in ``inference.extra_args``) have none; agentrl starts a CPU engine's one worker in
   its engine core (:mod:`agentrl.inference.server`).
5. :func:`lora_adapter_manager`: the worker's ``model_runner.lora_manager._adapter_manager`` (a private
   attribute): the ``LoRAModelManager`` that holds the stacked slot buffers and the CPU adapter cache, which
   :mod:`agentrl.engine.adapter_plan` reads (with :func:`parse_lora_name` and :func:`peft_helper`).
6. Full-weight loading (:mod:`agentrl.engine.full`), through vLLM's layerwise reload (public functions of
   ``vllm.model_executor.model_loader.reload``, the same ones its weight-transfer engines call):
   :func:`begin_weight_load` / :func:`load_weight_bucket` / :func:`finish_weight_load` restore each layer's
   checkpoint-format parameters, load buckets through ``model.load_weights`` (which maps q/k/v onto
   ``qkv_proj``, shards for tensor parallelism...), and re-run each layer's weight processing once all its
   weights arrived (on CPU the linear layers hold oneDNN-packed weights, not the checkpoint tensors: a plain
   ``load_weights`` after start-up fails on them). The finish also drops the LoRA state derived from the old
   base weights (``model_runner.reset_lora_state``, as vLLM's ``finish_weight_update`` does), and redoes the
   processing of tied embeddings (:func:`refresh_tied_embeddings`: the trainer sends ``embed_tokens`` once, so
   vLLM never reprocesses ``lm_head``, whose CPU-packed GEMM weights would lag a version behind).
10. :func:`served_model`, :func:`model_config`, :func:`moe_geometry`: the served ``nn.Module``, the model's
    config, and the runner's step size (``max_num_tokens``).
11. Merged adapters (:mod:`agentrl.engine.merge`): :func:`peft_helper_from_dict` (each module's scaling from
    the adapter config the publisher sends) and :func:`packed_modules` (the model's ``packed_modules_mapping``:
    which siblings a merged module's layer also needs); the load itself is lookup 6.

13. :func:`hook_core_requests` (a per-instance wrap of the in-process engine core): replaces one
    ``EngineCoreProc``'s ``_handle_client_request`` so that an item of agentrl's own kind on its
    ``input_queue`` runs a callable in the busy loop, between two engine steps (as vLLM's utility calls run),
    and :func:`wake_core` puts such an item there (``queue.Queue.put_nowait`` wakes a loop blocked on an idle
    queue). The local control socket (:mod:`agentrl.engine.control`) runs the hot weight-sync sequence this
    way, without the API server and its HTTP round trips; :func:`pause_core` freezes generation where a merge
    failed half-way.
19. :func:`wrap_weight_version_attach` (a per-instance wrap of the in-process engine core, once an adapter has
    a weight label of its own): ``EngineCore._attach_weight_version``, which puts the engine-wide label on every
    step's ``EngineCoreOutputs.weight_version``, puts there the composite of it and the adapters' labels
    instead (:mod:`agentrl.engine.adapter_labels`); with no adapter labelled it leaves vLLM's string as is.

21. :func:`patch_output_layer_lora` (wrapped): ``vllm.lora.model_manager.get_supported_lora_modules`` lists
   ``lm_head`` for models whose class does not declare it in ``embedding_modules`` (Qwen2), so that vLLM's
   output-layer LoRA serves their adapters' ``lm_head`` (``trainer.lora_train_unembed``).

Installed in the API server process by :mod:`agentrl.engine.serve` (CPU build, one worker in the engine core):

12. :func:`patch_cpu_engine_core_fork`: wraps ``CpuPlatform.check_and_update_config``, which sets
    ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` for every CPU engine, so that the API server forks its engine-core
    process (``get_mp_context``) instead of spawning it. A spawned engine core imports vLLM (and torch) again:
    about 16 s of a 35-41 s start on an idle 2-core machine; forked, it starts with them imported (21-23 s in
    all). The API server has computed nothing at that point, so no OpenMP pool is inherited; the engine core
    binds its threads itself (``init_cpu_threads_env``) as before. Not with worker processes of their own
    (tensor parallelism, or ``mp``): those fork from the engine core, which has computed.
22. :func:`patch_cpu_compile_with_lora`: wraps ``CpuPlatform.check_and_update_config`` (after patch 12), which
    turns compilation off for any engine with LoRA (``compilation_config.mode = NONE``: vLLM's CPU LoRA ops
    branch in Python on each step's mapping, which a trace would freeze). With agentrl's fast path each LoRA
    linear layer is one custom op in the graph (``agentrl::lora_linear``, :func:`cpu_lora.compiled_linear_op`)
    that reads the step's grouping when it runs, so the check runs with ``lora_config`` hidden and the model is
    compiled as it is without LoRA (dynamo traced once, inductor): on the embedded model a LoRA engine ran its
    model eagerly at 0.5-0.63 of a LoRA-less engine's rate, with no adapter in use. ``AGENTRL_CPU_LORA_COMPILE=0``
    keeps vLLM's rule.
20. :func:`patch_request_labels`: wraps ``RequestState.track_weight_version`` (``v1/engine/output_processor.py``),
    which turns each step's weight label into the request's ``weight_versions`` spans, so that a request reads
    from a composite label the label of the adapter it names (``RequestState.lora_name``), else the
    engine-wide one (:func:`agentrl.engine.adapter_labels.label_for`); a plain label passes through unchanged.

This module must import without vLLM (the launcher imports the extension outside a worker): vLLM and
msgspec are imported inside the functions.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from agentrl.engine.contract import Kind, PrivateUse, Target
from agentrl.engine.version_gate import check_vllm_version as _check

WRITTEN_FOR_VLLM = "0.32.0"
"""The vLLM version these patches were written for and checked against."""

PRIVATE_USES: list[PrivateUse] = []
"""One record per patch, wrap and lookup below (filled as the module is read)."""

F = TypeVar("F", bound=Callable[..., Any])

_WM = "vllm.lora.worker_manager"
_GPU = "vllm.v1.worker.gpu_model_runner"
_CPU = "vllm.v1.worker.cpu_model_runner"
_LORA_RUNNER = "vllm.v1.worker.lora_model_runner_mixin"
_WORKER = "vllm.v1.worker.worker_base"
_MODEL_CONFIG = "vllm.config.model"
_FUSED_MOE = "vllm.model_executor.layers.fused_moe"
_BLOCKS = "vllm.v1.worker.block_table"


def _uses(kind: Kind, *targets: Target) -> Callable[[F], F]:
    """Record the decorated function as a use of vLLM's private API of ``kind``, touching ``targets``."""

    def record(fn: F) -> F:
        use = PrivateUse(fn.__name__, kind, WRITTEN_FOR_VLLM, targets)
        PRIVATE_USES.append(use)
        fn.vllm_use = use  # type: ignore[attr-defined]
        return fn

    return record


def targets() -> list[Target]:
    """Every target of every recorded use, once each, in the order recorded."""
    return list(dict.fromkeys(t for use in PRIVATE_USES for t in use.targets))


def check_vllm_version(running: str | None = None, allow: str | None = None) -> str:
    """The running vLLM's version when the patches may be installed into it; raises
    :class:`agentrl.engine.version_gate.VLLMVersionRefused` (naming both versions and the override)
    otherwise. ``running`` / ``allow`` stand in for the installed version and the environment in tests."""
    return _check(WRITTEN_FOR_VLLM, running, allow)


def install_patches(registry: dict[str, tuple[int, str]], stats: dict[str, float],
                    attach_router_tap: Callable[[Any], Any],
                    release_hooks: list[Callable[[Any, int], None]] | None = None,
                    removal_hooks: list[Callable[[Any, int], None]] | None = None) -> None:
    """Install the monkeypatches (1-3, 7, 8, 14, 15, 17, 18, 21; idempotent) in a vLLM worker process, after the
    version check. ``release_hooks``: called with (manager, adapter id) before an adapter's slot is released
    (patch 14); ``removal_hooks``: the same, before an adapter leaves the manager (patch 18).

    ``registry`` (lora_name -> (lora_int_id, lora_path)) and ``stats`` (``file_loads``,
    ``last_file_load_ms``) are the extension's dicts, filled by the hooks; ``attach_router_tap(runner)`` taps a
    freshly loaded model's MoE routers (patch 7). Raises ``VLLMVersionRefused``
    before touching anything on another vLLM (unless overridden), and other errors when vLLM's layout changed
    (the caller reports both)."""
    check_vllm_version()
    patch_lora_worker_manager(registry, stats)
    patch_lora_slot_release(release_hooks if release_hooks is not None else [])
    patch_lora_removal(removal_hooks if removal_hooks is not None else [])
    patch_router_tap(attach_router_tap)
    patch_moe_reload_prepack()
    patch_cpu_seeded_chunks()
    patch_output_layer_lora()
    stats["cpu_lora_fast"] = float(patch_cpu_lora_fast_path())
    if stats["cpu_lora_fast"]:
        from agentrl.engine import native_lora

        stats["cpu_lora_native"] = float(native_lora.tile() > 0)  # loaded with the vector path it serves with


# -- monkeypatches -----------------------------------------------------------------------------------------

@_uses("patch", Target("vllm.lora.model_manager", "get_supported_lora_modules"),
       Target("vllm.model_executor.layers.vocab_parallel_embedding", "ParallelLMHead"))
def patch_output_layer_lora() -> None:
    """Patch 21 (idempotent): vLLM serves a LoRA on the output layer (``LogitsProcessorWithLoRA``) only for a
    model class that lists ``lm_head`` in its ``embedding_modules`` (Llama does; Qwen2, the embedded model's
    architecture, does not), and refuses an adapter that has one otherwise. The LoRA manager's list of the
    modules it supports gets ``lm_head`` for every model with a ``ParallelLMHead`` named so beside a
    ``logits_processor``: the layer vLLM's wrapper was written for (``trainer.lora_train_unembed``)."""
    from vllm.lora import model_manager
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    original = model_manager.get_supported_lora_modules
    if getattr(original, "_agentrl_hook", False):
        return

    def get_supported_lora_modules(model: Any) -> list[str]:
        names = original(model)
        head = getattr(model, "lm_head", None)
        if isinstance(head, ParallelLMHead) and hasattr(model, "logits_processor") and "lm_head" not in names:
            names = [*names, "lm_head"]
        return names

    get_supported_lora_modules._agentrl_hook = True  # type: ignore[attr-defined]
    get_supported_lora_modules._agentrl_original = original  # type: ignore[attr-defined]
    model_manager.get_supported_lora_modules = get_supported_lora_modules


@_uses("patch", Target("vllm.lora.model_manager", "LoRAModelManager._deactivate_adapter"))
def patch_lora_slot_release(hooks: list[Callable[[Any, int], None]]) -> None:
    """Patch 14 (idempotent): every hook of ``hooks`` is called with (manager, adapter id) before vLLM releases
    that adapter's slot; see the module docstring."""
    from vllm.lora.model_manager import LoRAModelManager

    _hooks_first(LoRAModelManager, "_deactivate_adapter", hooks)


def _hooks_first(cls: type, method: str, hooks: list[Callable[[Any, int], None]]) -> None:
    """Wrap ``cls.<method>(adapter_id)`` (vLLM's ``LoRAModelManager``) so that every hook of ``hooks`` is called
    with (manager, adapter id) before it (idempotent: an already wrapped method is left as it is)."""
    original = getattr(cls, method)
    if getattr(original, "_agentrl_hook", False):
        return

    def wrapped(self: Any, adapter_id: int) -> Any:
        for hook in hooks:
            hook(self, adapter_id)
        return original(self, adapter_id)

    wrapped.__name__ = wrapped.__qualname__ = method
    wrapped._agentrl_hook = True  # type: ignore[attr-defined]
    wrapped._agentrl_original = original  # type: ignore[attr-defined]
    setattr(cls, method, wrapped)


@_uses("patch", Target("vllm.lora.model_manager", "LoRAModelManager.deactivate_adapter"),
       Target("vllm.lora.model_manager", "LoRAModelManager.remove_adapter"),
       Target("vllm.lora.model_manager", "LoRAModelManager._registered_adapters", instance=True))
def patch_lora_removal(hooks: list[Callable[[Any, int], None]]) -> None:
    """Patch 18 (idempotent): every hook of ``hooks`` is called with (manager, adapter id) before vLLM removes
    that adapter from the manager; see the module docstring."""
    from vllm.lora.model_manager import LoRAModelManager

    _hooks_first(LoRAModelManager, "deactivate_adapter", hooks)


@_uses("patch", Target(_WM, "WorkerLoRAManager._load_adapter"), Target(_WM, "WorkerLoRAManager.list_adapters"),
       Target(_WM, "LRUCacheWorkerLoRAManager.add_adapter"), Target(_WM, "LRUCacheWorkerLoRAManager._apply_adapters"),
       Target("vllm.lora.request", "LoRARequest.lora_name"), Target("vllm.lora.request", "LoRARequest.lora_int_id"),
       Target("vllm.lora.request", "LoRARequest.lora_path"), Target("vllm.lora.request", "LoRARequest.load_inplace"))
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


_PUNICA_CPU = "vllm.lora.punica_wrapper.punica_cpu"


@_uses("patch", Target(_PUNICA_CPU, "PunicaWrapperCPU.update_metadata"),
       Target(_PUNICA_CPU, "PunicaWrapperCPU.add_lora_linear"), Target(_PUNICA_CPU, "PunicaWrapperCPU.add_shrink"),
       Target(_PUNICA_CPU, "PunicaWrapperCPU.add_expand"), Target(_PUNICA_CPU, "PunicaWrapperCPU.add_lora_logits"),
       Target("vllm.lora.punica_wrapper.punica_base", "PunicaWrapperBase.token_lora_indices"),
       Target("vllm.lora.punica_wrapper.punica_base", "PunicaWrapperBase.sampler_indices"),
       Target("vllm.platforms", "current_platform"))
def patch_cpu_lora_fast_path(force: bool = False) -> bool:
    """Patch 17: the CPU LoRA fast path (:mod:`agentrl.engine.cpu_lora`) in place of vLLM's torch ops, on the
    CPU build (``force``: on any build, for tests) unless ``AGENTRL_CPU_LORA_FAST=0``. Idempotent; whether it
    is installed."""
    from agentrl.engine import cpu_lora

    if not cpu_lora.enabled():
        return False
    from vllm.platforms import current_platform

    if not force and not current_platform.is_cpu():
        return False
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    update, linear = PunicaWrapperCPU.update_metadata, PunicaWrapperCPU.add_lora_linear
    shrink, expand = PunicaWrapperCPU.add_shrink, PunicaWrapperCPU.add_expand
    logits = PunicaWrapperCPU.add_lora_logits
    if getattr(update, "_agentrl_hook", False):
        return True

    def update_metadata(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = update(self, *args, **kwargs)
        cpu_lora.wrapper_key(self)
        self._agentrl_groups = cpu_lora.Groups.of(self.token_lora_indices)
        self._agentrl_rows = cpu_lora.Groups.of(self.sampler_indices)  # the output layer's rows, one per sample
        return out

    def _groups(self: Any, y: Any, x: Any, *weights: Any) -> Any:
        g = getattr(self, "_agentrl_groups", None)
        fits = g is not None and g.covers(x) and y.size(-2) == g.n and cpu_lora.same_dtype(y, x, *weights)
        return g if fits else None

    def eager_linear(self: Any, y: Any, x: Any, lora_a_stacked: Any, lora_b_stacked: Any, scale: float,
                     output_slices: Any, *, buffer: Any = None, **kwargs: Any) -> Any:
        g = None if buffer is not None or kwargs.get("add_inputs", True) is False or y.dim() != 2 \
            else _groups(self, y, x, lora_a_stacked, lora_b_stacked)
        if g is None:
            return linear(self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices, buffer=buffer,
                          **kwargs)
        cpu_lora.lora_linear(g, y, x, lora_a_stacked, lora_b_stacked, scale, tuple(output_slices))
        return None

    op = cpu_lora.compiled_linear_op(
        lambda key, y, x, a, b, scale, slices: eager_linear(cpu_lora.WRAPPERS[key], y, x, tuple(a), tuple(b),
                                                            scale, tuple(slices)))

    def add_lora_linear(self: Any, y: Any, x: Any, lora_a_stacked: Any, lora_b_stacked: Any, scale: float,
                        output_slices: Any, *, buffer: Any = None, **kwargs: Any) -> Any:
        if buffer is None and kwargs.get("add_inputs", True) is not False and cpu_lora.compiling():
            # traced into vLLM's compiled model: one opaque op, whose body reads the step's grouping at run time
            op(y, x, list(lora_a_stacked), list(lora_b_stacked), float(scale), [int(s) for s in output_slices],
               cpu_lora.wrapper_key(self))
            return None
        return eager_linear(self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices, buffer=buffer,
                            **kwargs)

    def add_shrink(self: Any, y: Any, x: Any, lora_a_stacked: Any, scale: float, **kwargs: Any) -> Any:
        x2 = x.view(-1, x.shape[-1])
        g = None if isinstance(y, tuple) or y.dim() != 3 else _groups(self, y, x2, lora_a_stacked)
        if g is None:
            return shrink(self, y, x, lora_a_stacked, scale, **kwargs)
        cpu_lora.shrink(g, y, x2, lora_a_stacked, scale)
        return None

    def add_expand(self: Any, y: Any, x: Any, lora_b_stacked: Any, output_slices: Any, offset_start: int = 0,
                   add_inputs: bool = True, **kwargs: Any) -> Any:
        g = None if not add_inputs or isinstance(x, tuple) or x.dim() != 3 or y.dim() != 2 \
            else _groups(self, y, x[0], lora_b_stacked)
        if g is None:
            return expand(self, y, x, lora_b_stacked, output_slices, offset_start, add_inputs, **kwargs)
        cpu_lora.expand(g, y, x, lora_b_stacked, tuple(output_slices), offset_start)
        return None

    def add_lora_logits(self: Any, y: Any, x: Any, lora_a_stacked: Any, lora_b_stacked: Any, scale: float, *,
                        buffer: Any = None, **kwargs: Any) -> Any:
        x2, y2 = x.view(-1, x.shape[-1]), y.view(-1, y.shape[-1])
        rows = cpu_lora.logit_rows(getattr(self, "_agentrl_rows", None), getattr(self, "_agentrl_groups", None),
                                   self.token_lora_indices, x2)
        g = None if buffer is not None or rows is None or y2.size(0) != rows.n or not cpu_lora.same_dtype(
            y2, x2, lora_a_stacked, lora_b_stacked) else rows
        if g is None:
            return logits(self, y, x, lora_a_stacked, lora_b_stacked, scale, buffer=buffer, **kwargs)
        width = min(lora_b_stacked.size(2), y2.size(1))  # the logits may be padded past the vocabulary
        cpu_lora.lora_linear(g, y2, x2, (lora_a_stacked,), (lora_b_stacked,), scale, (width,))
        return None

    for fn, orig in ((update_metadata, update), (add_lora_linear, linear), (add_shrink, shrink),
                     (add_expand, expand), (add_lora_logits, logits)):
        fn._agentrl_original = orig  # type: ignore[attr-defined]
    update_metadata._agentrl_hook = True  # type: ignore[attr-defined]
    PunicaWrapperCPU.update_metadata = update_metadata  # type: ignore[method-assign]
    PunicaWrapperCPU.add_lora_linear = add_lora_linear  # type: ignore[method-assign]
    PunicaWrapperCPU.add_shrink = add_shrink  # type: ignore[method-assign]
    PunicaWrapperCPU.add_expand = add_expand  # type: ignore[method-assign]
    PunicaWrapperCPU.add_lora_logits = add_lora_logits  # type: ignore[method-assign]
    return True


@_uses("patch", Target(_GPU, "GPUModelRunner.load_model"), Target(_CPU, "CPUModelRunner.load_model", optional=True))
def patch_router_tap(attach: Callable[[Any], Any]) -> None:
    """Patch 7: after a model runner loads its model (and before vLLM compiles it), tap its MoE routers:
    ``attach(runner)`` (:meth:`agentrl.engine.capture.RouterTap.attach`; None for a dense model). Idempotent."""
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
                self._agentrl_router_tap = attach(self)
            return out

        load_model._agentrl_hook = True  # type: ignore[attr-defined]
        cls.load_model = load_model  # type: ignore[method-assign]


@_uses("patch", Target(f"{_FUSED_MOE}.unquantized_fused_moe_method", "UnquantizedFusedMoEMethod._setup_kernel"),
       Target(f"{_FUSED_MOE}.fused_moe_method_base", "FusedMoEMethodBase.moe_kernel", instance=True),
       Target(f"{_FUSED_MOE}.modular_kernel", "FusedMoEKernel.fused_experts"),
       Target(f"{_FUSED_MOE}.experts.cpu_moe", "CPUUnquantizedExperts.process_weights_after_loading",
              optional=True))
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


_BATCH = "vllm.v1.worker.gpu_input_batch"
_SAMPLER = "vllm.v1.sample.sampler"


@_uses("patch", Target(_GPU, "GPUModelRunner._sample"), Target(_GPU, "GPUModelRunner._bookkeeping_sync"),
       Target(_GPU, "GPUModelRunner.discard_request_mask", instance=True),
       Target(_GPU, "GPUModelRunner.input_batch", instance=True),
       Target(_BATCH, "InputBatch.generators", instance=True), Target(_BATCH, "InputBatch.num_reqs"),
       Target(_CPU, "CPUModelRunner", optional=True))
def patch_cpu_seeded_chunks() -> None:
    """Patch 15 (idempotent; nothing on a build without the CPU runner): seeded sampling that survives a
    discarded sample on the CPU runner; see the module docstring."""
    try:
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    except ImportError:  # a GPU build
        return
    rewind_discarded_draws(CPUModelRunner)


def _discarded_cpu_generators(runner: Any) -> dict[int, Any]:
    """Batch row -> generator of the seeded requests on a CPU generator whose sample this step discards."""
    batch = runner.input_batch
    rows = runner.discard_request_mask.np[:batch.num_reqs].nonzero()[0]
    gens = batch.generators
    return {int(i): gens[int(i)] for i in rows if int(i) in gens and gens[int(i)].device.type == "cpu"}


def rewind_discarded_draws(cls: type) -> None:
    """Wrap ``cls._sample`` and ``cls._bookkeeping_sync`` (patch 15): the draws of a discarded sample are
    undone on the generator's state, and vLLM's offset rewind runs without those generators. Idempotent."""
    sample, bookkeep = cls._sample, cls._bookkeeping_sync  # type: ignore[attr-defined]
    if getattr(sample, "_agentrl_hook", False):
        return

    def _sample(self: Any, *args: Any, **kwargs: Any) -> Any:
        held = {i: gen.get_state() for i, gen in _discarded_cpu_generators(self).items()}
        try:
            return sample(self, *args, **kwargs)
        finally:
            for i, state in held.items():
                self.input_batch.generators[i].set_state(state)

    def _bookkeeping_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        hidden = _discarded_cpu_generators(self)
        gens = self.input_batch.generators
        for i in hidden:
            del gens[i]
        try:
            return bookkeep(self, *args, **kwargs)
        finally:
            gens.update(hidden)

    _sample._agentrl_hook = True  # type: ignore[attr-defined]
    cls._sample = _sample  # type: ignore[attr-defined]
    cls._bookkeeping_sync = _bookkeeping_sync  # type: ignore[attr-defined]


# -- per-instance wraps and the step layout (routing capture) ----------------------------------------------

@_uses("wrap", Target(_GPU, "GPUModelRunner._prepare_inputs"), Target(_GPU, "GPUModelRunner.execute_model"),
       Target("vllm.v1.core.sched.output", "SchedulerOutput.finished_req_ids", instance=True))
def wrap_runner_step(runner: Any, after_prepare: Callable[[Any], None],
                     after_execute: Callable[[Any], None]) -> None:
    """Wrap 9: replace ``runner``'s ``_prepare_inputs`` (its second argument is the step's number of scheduled
    tokens per request, handed to ``after_prepare`` once it ran) and ``execute_model`` (the step's finished
    request ids handed to ``after_execute`` once the forward pass ran), on this instance only."""
    prepare, execute = runner._prepare_inputs, runner.execute_model

    def _prepare_inputs(scheduler_output: Any, num_scheduled: Any, *a: Any, **kw: Any) -> Any:
        out = prepare(scheduler_output, num_scheduled, *a, **kw)
        after_prepare(num_scheduled)
        return out

    def execute_model(scheduler_output: Any, *a: Any, **kw: Any) -> Any:
        out = execute(scheduler_output, *a, **kw)
        after_execute(getattr(scheduler_output, "finished_req_ids", None))
        return out

    runner._prepare_inputs, runner.execute_model = _prepare_inputs, execute_model


@_uses("wrap", Target(_GPU, "GPUModelRunner.sampler", instance=True), Target(_SAMPLER, "Sampler.sample"),
       Target(_SAMPLER, "Sampler.forward"))
def wrap_sampler(runner: Any, after_sample: Callable[[Any], None]) -> None:
    """Wrap 16: replace ``runner.sampler``'s ``sample`` (which ``Sampler.forward`` calls as ``self.sample``)
    on this instance, handing the processed logprobs it returns (``[rows, vocab]``, or None) to
    ``after_sample`` before returning them. Idempotent per hook."""
    sampler = runner.sampler
    sample = sampler.sample

    def wrapped(logits: Any, sampling_metadata: Any, *a: Any, **kw: Any) -> Any:
        sampled, processed = sample(logits, sampling_metadata, *a, **kw)
        after_sample(processed)
        return sampled, processed

    sampler.sample = wrapped


@_uses("lookup", Target(_GPU, "GPUModelRunner.input_batch", instance=True),
       Target(_GPU, "GPUModelRunner.discard_request_mask", instance=True),
       Target(_BATCH, "InputBatch.req_ids"), Target(_BATCH, "InputBatch.num_reqs"))
def sampled_rows(runner: Any) -> tuple[list[str | None], list[bool]]:
    """The request id of each row the sampler sampled this step, and whether vLLM discards that row's sample
    (a prefill split between steps)."""
    batch = runner.input_batch
    n = batch.num_reqs
    return list(batch.req_ids[:n]), [bool(x) for x in runner.discard_request_mask.np[:n]]


@_uses("lookup", Target(_SAMPLER, "Sampler.logprobs_mode", instance=True))
def logprobs_mode(runner: Any) -> str:
    """Which logprobs ``runner``'s sampler computes (``processed_logprobs``, ``raw_logprobs``, ...)."""
    return str(runner.sampler.logprobs_mode)


@_uses("lookup", Target(_GPU, "GPUModelRunner.input_batch", instance=True),
       Target(_GPU, "GPUModelRunner.positions", instance=True),
       Target("vllm.v1.worker.gpu_input_batch", "InputBatch.req_ids"),
       Target("vllm.v1.worker.gpu_input_batch", "InputBatch.block_table", instance=True),
       Target(_BLOCKS, "MultiGroupBlockTable.__getitem__"), Target(_BLOCKS, "BlockTable.block_table", instance=True),
       Target(_BLOCKS, "BlockTable.num_blocks_per_row", instance=True),
       Target(_BLOCKS, "BlockTable.block_size", instance=True), Target("vllm.v1.utils", "CpuGpuBuffer.np", instance=True))
def step_layout(runner: Any, num_scheduled: Any) -> list[tuple[str, Any, Any, int]]:
    """After ``_prepare_inputs``: ``(request id, positions, block-table row, block size)`` of each request with
    tokens in this step (``num_scheduled``: tokens per request, a numpy array), as numpy copies."""
    batch = runner.input_batch
    table = batch.block_table[0]
    total = int(num_scheduled.sum())
    buf = runner.positions  # a tensor (on the engine's device) or a CPU/GPU buffer pair
    positions = buf.np[:total] if hasattr(buf, "np") else buf[:total].to("cpu").numpy()
    layout = []
    off = 0
    for i, req_id in enumerate(batch.req_ids[: len(num_scheduled)]):
        n = int(num_scheduled[i])
        if n:
            blocks = table.block_table.np[i, : table.num_blocks_per_row[i]].copy()
            layout.append((req_id, positions[off: off + n].copy(), blocks, int(table.block_size)))
        off += n
    return layout


@_uses("lookup", Target(f"{_FUSED_MOE}.router.base_router", "BaseRouter"),
       Target(f"{_FUSED_MOE}.router.base_router", "BaseRouter.set_capture_fn"),
       Target(f"{_FUSED_MOE}.runner.moe_runner", "MoERunner.router", instance=True),
       Target(f"{_FUSED_MOE}.runner.moe_runner", "MoERunner.layer_id"))
def tap_moe_routers(model: Any, writer: Callable[[int], Callable[[Any], None]]) -> list[int]:
    """Set the capture hook of every MoE router of ``model`` (a module with a ``BaseRouter`` ``router`` and a
    ``layer_id``) to ``writer(layer_id)``; their layer ids, sorted. None is set when there is none (``[]``)."""
    from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter

    found: list[tuple[int, Any]] = []
    for module in model.modules():
        router = getattr(module, "router", None)
        if isinstance(router, BaseRouter) and hasattr(module, "layer_id"):
            found.append((int(module.layer_id), router))
    for layer_id, router in found:
        router.set_capture_fn(writer(layer_id))
    return sorted(layer_id for layer_id, _ in found)


@_uses("lookup", Target(_MODEL_CONFIG, "ModelConfig.get_num_experts"),
       Target(_MODEL_CONFIG, "ModelConfig.get_num_experts_per_tok"),
       Target(_MODEL_CONFIG, "ModelConfig.get_total_num_hidden_layers"),
       Target(_GPU, "GPUModelRunner.max_num_tokens", instance=True))
def moe_geometry(runner: Any) -> tuple[int, int, int, int]:
    """``(experts, top_k, layers, max tokens per step)`` of ``runner``'s model (experts 0 for a dense one)."""
    mc = model_config(runner)
    return (int(mc.get_num_experts()), int(mc.get_num_experts_per_tok()), int(mc.get_total_num_hidden_layers()),
            int(runner.max_num_tokens))


# -- lookups -------------------------------------------------------------------------------------------------

@_uses("lookup", Target("vllm.v1.engine.core", "EngineCore"), Target("vllm.v1.engine.core", "EngineCore.set_weight_version"),
       Target("vllm.v1.engine.core", "EngineCore.reset_prefix_cache"))
def find_engine_core() -> Any:
    """Lookup 4: the ``EngineCore`` among the callers of this function's caller (an in-process executor), or
    None. The walk starts at the caller, whose own ``self`` is never an ``EngineCore``. The extension calls
    its ``set_weight_version`` and ``reset_prefix_cache(reset_running_requests=...)``."""
    from vllm.v1.engine.core import EngineCore

    frame = sys._getframe(1)
    while frame is not None:
        obj = frame.f_locals.get("self")
        if isinstance(obj, EngineCore):
            return obj
        frame = frame.f_back
    return None


@_uses("lookup", Target(_WORKER, "WorkerBase.model_runner", instance=True),
       Target(_LORA_RUNNER, "LoRAModelRunnerMixin.lora_manager", instance=True),
       Target(_WM, "WorkerLoRAManager._adapter_manager", instance=True),
       # what the in-place copy reads through the manager (agentrl.engine.adapter, agentrl.engine.adapter_plan)
       Target("vllm.lora.model_manager", "LoRAModelManager.get_adapter"),
       Target("vllm.lora.model_manager", "LoRAModelManager.lora_index_to_id", instance=True),
       Target("vllm.lora.model_manager", "LoRAModelManager.modules", instance=True),
       Target("vllm.lora.model_manager", "LoRAModelManager.packed_modules", instance=True),
       Target("vllm.lora.model_manager", "LoRAModelManager.model", instance=True),
       Target("vllm.model_executor.models.interfaces", "SupportsQuant.hf_to_vllm_mapper"),
       Target("vllm.model_executor.models.utils", "WeightsMapper.get_rename_mapper"),
       Target("vllm.lora.lora_model", "LoRAModel.loras", instance=True),
       Target("vllm.lora.lora_weights", "LoRALayerWeights.lora_a", instance=True),
       Target("vllm.lora.lora_weights", "LoRALayerWeights.lora_b", instance=True),
       Target("vllm.lora.layers.base_linear", "BaseLinearLayerWithLoRA.lora_a_stacked", instance=True),
       Target("vllm.lora.layers.base_linear", "BaseLinearLayerWithLoRA.lora_b_stacked", instance=True),
       Target("vllm.lora.layers.base_linear", "BaseLinearLayerWithLoRA.tp_size", instance=True),
       Target("vllm.lora.layers.base", "BaseLayerWithLoRA.set_lora"))
def lora_adapter_manager(worker: Any) -> Any:
    """Lookup 5: the worker's ``LoRAModelManager`` (``model_runner.lora_manager._adapter_manager``), or None
    when LoRA is not enabled."""
    runner = getattr(worker, "model_runner", None)
    return getattr(getattr(runner, "lora_manager", None), "_adapter_manager", None)


@_uses("lookup", Target("vllm.lora.utils", "parse_fine_tuned_lora_name"))
def parse_lora_name(name: str, mapper: Any = None) -> tuple[str, bool]:
    """vLLM's reading of a peft tensor name: ``(module name, is lora_A)`` (``mapper``: the model's rename
    mapper, or None)."""
    from vllm.lora.utils import parse_fine_tuned_lora_name

    return parse_fine_tuned_lora_name(name, mapper)


@_uses("lookup", Target("vllm.lora.peft_helper", "PEFTHelper.from_local_dir"),
       Target("vllm.lora.peft_helper", "PEFTHelper.get_rank_and_scaling"))
def peft_helper(path: str) -> Any:
    """vLLM's reading of the adapter config in directory ``path`` (its ``get_rank_and_scaling(module)`` gives
    the scaling vLLM folded into B)."""
    from vllm.lora.peft_helper import PEFTHelper

    return PEFTHelper.from_local_dir(path, None)


@_uses("lookup", Target(_GPU, "GPUModelRunner.get_model"), Target(_CPU, "CPUModelRunner.get_model", optional=True))
def served_model(worker: Any) -> Any:
    """The ``nn.Module`` a vLLM worker serves (``model_runner.get_model()``, or ``.model`` on older runners)."""
    return runner_model(worker.model_runner)


def runner_model(runner: Any) -> Any:
    """The ``nn.Module`` a model runner serves (part of :func:`served_model`'s record)."""
    return runner.get_model() if hasattr(runner, "get_model") else runner.model


@_uses("lookup", Target(_WORKER, "WorkerBase.vllm_config", instance=True),
       Target(_GPU, "GPUModelRunner.vllm_config", instance=True), Target("vllm.config", "VllmConfig.model_config"),
       Target(_MODEL_CONFIG, "ModelConfig.model"), Target(_MODEL_CONFIG, "ModelConfig.hf_text_config", instance=True))
def model_config(owner: Any) -> Any:
    """The ``ModelConfig`` of a worker or a model runner (``vllm_config.model_config``): ``model`` (its name),
    ``hf_text_config.model_type``, and the MoE shape (:func:`moe_geometry`)."""
    return owner.vllm_config.model_config


@_uses("lookup", Target("vllm.lora.peft_helper", "PEFTHelper.from_dict"),
       Target("vllm.lora.peft_helper", "PEFTHelper.get_rank_and_scaling"))
def peft_helper_from_dict(config: dict[str, Any]) -> Any:
    """vLLM's reading of an adapter config given as a dict (``adapter_config.json``'s content), as
    :func:`peft_helper` reads it from a directory: the merged path scales each module exactly as vLLM's
    LoRA loading does."""
    from vllm.lora.peft_helper import PEFTHelper

    return PEFTHelper.from_dict(config)


@_uses("lookup", Target("vllm.model_executor.models.interfaces", "SupportsLoRA.packed_modules_mapping"))
def packed_modules(model: Any) -> dict[str, list[str]]:
    """The sub-projections vLLM packs into one layer of ``model`` (``{"qkv_proj": ["q_proj", "k_proj",
    "v_proj"], ...}``; empty for a model that packs none)."""
    return {k: list(v) for k, v in (getattr(model, "packed_modules_mapping", None) or {}).items()}


# -- full-weight loading -----------------------------------------------------------------------------------

@_uses("lookup", Target("vllm.config", "set_current_vllm_config"),
       Target("vllm.model_executor.model_loader.reload", "initialize_layerwise_reload"))
def begin_weight_load(worker: Any) -> None:
    """Lookup 6a: prepare every layer of ``worker``'s model to receive checkpoint-format weights."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

    with set_current_vllm_config(worker.vllm_config):
        initialize_layerwise_reload(served_model(worker))


@_uses("lookup", Target("vllm.config", "set_current_vllm_config"))
def load_weight_bucket(worker: Any, weights: Any) -> None:
    """Lookup 6b: load ``(name, tensor)`` pairs (Hugging Face names) between begin and finish."""
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(worker.vllm_config):
        served_model(worker).load_weights(weights)


@_uses("lookup", Target("vllm.model_executor.model_loader.reload", "finalize_layerwise_reload"),
       Target(_LORA_RUNNER, "LoRAModelRunnerMixin.reset_lora_state"))
def finish_weight_load(worker: Any) -> None:
    """Lookup 6c: process the layers that were not processed on the fly and drop derived LoRA state."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

    with set_current_vllm_config(worker.vllm_config):
        model = served_model(worker)
        finalize_layerwise_reload(model, worker.vllm_config.model_config)
        refresh_tied_embeddings(model)
    reset = getattr(worker.model_runner, "reset_lora_state", None)
    if reset is not None:
        reset()


@_uses("lookup", Target("vllm.model_executor.layers.vocab_parallel_embedding", "UnquantizedEmbeddingMethod"),
       Target("vllm.model_executor.layers.vocab_parallel_embedding",
              "UnquantizedEmbeddingMethod.process_weights_after_loading"),
       Target("vllm.model_executor.layers.vocab_parallel_embedding", "VocabParallelEmbedding.quant_method",
              instance=True))
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


# -- the engine core's request loop (the local control socket) ---------------------------------------------

_CORE = "vllm.v1.engine.core"


@_uses("wrap", Target(_CORE, "EngineCoreProc._handle_client_request"), Target(_CORE, "EngineCoreProc._process_input_queue"))
def hook_core_requests(core: Any, kind: object, run: Callable[[Any], None]) -> None:
    """Wrap 13 (idempotent per ``kind``): ``core``'s busy loop calls ``run(payload)`` for every ``(kind,
    payload)`` item of its input queue, between two engine steps; every other item goes to vLLM as before."""
    original = core._handle_client_request
    if getattr(original, "agentrl_kind", None) is kind:
        return

    def handle(request_type: Any, request: Any) -> None:
        if request_type is kind:
            run(request)
            return
        original(request_type, request)

    handle.agentrl_kind = kind  # type: ignore[attr-defined]
    core._handle_client_request = handle


@_uses("lookup", Target(_CORE, "EngineCoreProc.input_queue", instance=True))
def wake_core(core: Any, kind: object, payload: Any) -> None:
    """Put ``(kind, payload)`` on ``core``'s input queue (from any thread): its busy loop wakes, if idle, and
    hands it to the hook of :func:`hook_core_requests` before its next step."""
    core.input_queue.put_nowait((kind, payload))


@_uses("lookup", Target(_CORE, "EngineCore.pause_scheduler"), Target(_CORE, "EngineCore.collective_rpc"))
def pause_core(core: Any) -> None:
    """Freeze generation on ``core`` (vLLM's ``keep`` pause: running requests keep their KV), from its busy
    loop: a merge that failed half-way must not serve a mix until the publisher takes the engine out."""
    core.pause_scheduler(mode="keep", clear_cache=False)


@_uses("wrap", Target(_CORE, "EngineCore._attach_weight_version"), Target(_CORE, "EngineCore.get_weight_version"),
       Target("vllm.v1.engine", "EngineCoreOutputs.weight_version"))
def wrap_weight_version_attach(core: Any, composite: Callable[[str], str]) -> None:
    """Wrap 19 (idempotent): ``core`` labels each step's outputs ``composite(engine-wide label)`` instead of the
    engine-wide label; a step with no outputs is left as vLLM leaves it."""
    original = core._attach_weight_version
    if getattr(original, "agentrl_labels", False):
        return

    def attach(outputs: dict[int, Any]) -> None:
        original(outputs)
        if outputs:
            label = composite(core.get_weight_version())
            for eco in outputs.values():
                eco.weight_version = label

    attach.agentrl_labels = True  # type: ignore[attr-defined]
    core._attach_weight_version = attach


# -- the API server (agentrl.engine.serve) ---------------------------------------------------------------------

_SERVE = "vllm.entrypoints.launchers.api_server.entry"


@_uses("patch", Target("vllm.platforms.cpu", "CpuPlatform.check_and_update_config"),
       Target("vllm.utils.system_utils", "get_mp_context"), Target("vllm.envs", "VLLM_WORKER_MULTIPROC_METHOD"))
def patch_cpu_engine_core_fork() -> None:
    """Patch 12 (idempotent): the CPU platform's config check leaves the process start method at ``fork`` (the
    method the API server uses to start its engine core); everything else it sets stays."""
    import os

    from vllm.platforms.cpu import CpuPlatform

    original = CpuPlatform.check_and_update_config.__func__  # type: ignore[attr-defined]
    if getattr(original, "agentrl_fork", False):
        return

    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        original(cls, vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    check_and_update_config.agentrl_fork = True  # type: ignore[attr-defined]
    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)  # type: ignore[assignment]
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"  # the CLI set-up would choose spawn when unset


@_uses("patch", Target("vllm.platforms.cpu", "CpuPlatform.check_and_update_config"),
       Target("vllm.config.vllm", "VllmConfig.lora_config"))
def patch_cpu_compile_with_lora() -> bool:
    """Patch 22 (idempotent): the CPU platform's config check leaves an engine with LoRA compiled; whether it
    is installed (not where the fast path or its compiled op is switched off, :func:`cpu_lora.compile_enabled`).
    See the module docstring."""
    from agentrl.engine import cpu_lora

    if not cpu_lora.compile_enabled():
        return False
    from vllm.platforms.cpu import CpuPlatform

    original = CpuPlatform.check_and_update_config.__func__  # type: ignore[attr-defined]
    if getattr(original, "agentrl_compile_lora", False):
        return True

    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        lora = vllm_config.lora_config
        if lora is None:
            return original(cls, vllm_config)
        vllm_config.lora_config = None  # the check's one LoRA rule: compilation off
        try:
            original(cls, vllm_config)
        finally:
            vllm_config.lora_config = lora
        return None

    check_and_update_config.agentrl_compile_lora = True  # type: ignore[attr-defined]
    check_and_update_config.agentrl_fork = getattr(original, "agentrl_fork", False)  # type: ignore[attr-defined]
    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)  # type: ignore[assignment]
    return True


@_uses("patch", Target("vllm.v1.engine.output_processor", "RequestState.track_weight_version"),
       Target("vllm.v1.engine.output_processor", "RequestState.lora_name", instance=True))
def patch_request_labels(pick: Callable[[str, str | None], str]) -> None:
    """Patch 20 (idempotent): each request tracks ``pick(step label, its adapter name or None)`` as its weight
    label (:func:`agentrl.engine.adapter_labels.label_for`); see the module docstring."""
    from vllm.v1.engine.output_processor import RequestState

    track = RequestState.track_weight_version
    if getattr(track, "_agentrl_hook", False):
        return

    def track_weight_version(self: Any, weight_version: str) -> None:
        track(self, pick(weight_version, self.lora_name))

    track_weight_version._agentrl_hook = True  # type: ignore[attr-defined]
    track_weight_version._agentrl_original = track  # type: ignore[attr-defined]
    RequestState.track_weight_version = track_weight_version  # type: ignore[method-assign]


@_uses("lookup", Target(_SERVE, "main"))
def run_api_server() -> None:
    """vLLM's OpenAI-compatible API server, reading ``sys.argv`` (the module ``python -m
    vllm.entrypoints.openai.api_server`` runs, without its deprecation warning)."""
    from vllm.entrypoints.launchers.api_server.entry import main

    main()


__all__ = [
    "PRIVATE_USES", "WRITTEN_FOR_VLLM", "begin_weight_load", "check_vllm_version", "find_engine_core",
    "finish_weight_load", "hook_core_requests", "install_patches", "load_weight_bucket", "lora_adapter_manager",
    "model_config", "moe_geometry", "parse_lora_name", "patch_cpu_engine_core_fork", "patch_lora_removal",
    "patch_lora_slot_release", "patch_lora_worker_manager", "patch_moe_reload_prepack", "patch_output_layer_lora",
    "patch_request_labels", "patch_router_tap", "pause_core", "peft_helper", "refresh_tied_embeddings",
    "run_api_server", "runner_model", "served_model", "step_layout", "tap_moe_routers", "targets", "wake_core",
    "wrap_runner_step", "wrap_weight_version_attach",
]
