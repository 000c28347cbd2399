"""Weight-version labels per LoRA adapter, on an engine that serves several adapters each updated in place.

vLLM labels the served weights with one engine-wide string (``set_weight_version``, ``POST
/update_weight_version``); its engine core attaches it to every step's outputs and the API server turns it into
each request's ``weight_versions`` spans. With two adapters on one engine (``policy`` at v5, ``ref`` at v1), an
in-place sync of ``ref`` that set that one label would relabel the tokens of ``policy``'s requests.

So an in-place sync of an adapter (:func:`agentrl.engine.slots.label_and_reset` with the adapter's name) labels
that adapter only (:func:`set_label`, in the engine core's process). While any adapter has a label of its own,
the per-step label that travels to the API server is a composite (:func:`encode`): the engine-wide label and
each labelled adapter's. The API server (patched by :mod:`agentrl.engine.serve`) reads, for each request, the
label of the adapter the request names, else the engine-wide one (:func:`label_for`). With no adapter labelled,
the per-step label is the engine-wide string itself, byte for byte. An adapter that leaves the engine
(unloaded, evicted from vLLM's CPU cache of adapters, or reloaded from a file) forgets its label
(:func:`forget_lora_id`): it then serves weights that no in-place sync labelled.

Per-adapter labels need both halves: the engine core labels per adapter only where the API server reads the
composite (:data:`ENV`, set by :mod:`agentrl.engine.serve` for the engine core it starts); elsewhere an
in-place sync sets the engine-wide label, as vLLM does.

This module must import without vLLM (the launcher imports the extension to check it).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from typing import Any

from agentrl.engine import vllm_patches

ENV = "AGENTRL_ADAPTER_LABELS"
"""Set to ``1`` in the API server's environment (and so its engine core's) when the API server reads composite
labels: only then does an in-place sync label its adapter alone."""
PREFIX = "agentrl-adapter-labels:"
"""The start of a composite label (a plain weight label never starts with it: agentrl's are integers)."""
_ATTR = "_agentrl_adapter_labels"


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process's API server reads composite labels (``environ``: ``os.environ`` unless given)."""
    return (os.environ if environ is None else environ).get(ENV) == "1"


def encode(base: str, adapters: Mapping[str, str]) -> str:
    """The per-step label: ``base`` itself when no adapter has a label of its own, else the composite of
    ``base`` and ``adapters`` (adapter name -> label)."""
    if not adapters:
        return base
    return PREFIX + json.dumps({"base": base, "adapters": dict(adapters)}, sort_keys=True, separators=(",", ":"))


def decode(label: str) -> tuple[str, dict[str, str]]:
    """``(engine-wide label, adapter name -> label)`` of a per-step label; a plain label (or a composite that
    does not parse) is the engine-wide label of no adapter."""
    if not label.startswith(PREFIX):
        return label, {}
    try:
        data = json.loads(label[len(PREFIX):])
        base, adapters = data["base"], data["adapters"]
    except (ValueError, KeyError, TypeError):
        return label, {}
    if not isinstance(base, str) or not isinstance(adapters, dict):
        return label, {}
    return base, {str(k): str(v) for k, v in adapters.items()}


@functools.lru_cache(maxsize=1024)
def label_for(label: str, lora_name: str | None) -> str:
    """The label of the tokens of a request for adapter ``lora_name`` (None: the base model) in a step labelled
    ``label``: the adapter's own label if it has one, else the engine-wide one. Cached: every request reads it
    at every step, and the label changes only at a sync."""
    base, adapters = decode(label)
    return adapters.get(lora_name, base) if lora_name is not None else base


def adapter_name(adapter: str, registry: Mapping[str, tuple[int, str]]) -> str:
    """The LoRA name requests use for ``adapter`` (a name, or an int id as the sync transports accept), from
    ``registry`` (name -> (id, path)); "" when there is none."""
    if adapter in registry:
        return adapter
    if adapter.isdigit():
        return next(iter(names_of(int(adapter), registry)), "")
    return ""


def names_of(lora_id: int, registry: Mapping[str, tuple[int, str]]) -> list[str]:
    """The LoRA names ``registry`` (name -> (id, path)) maps to adapter id ``lora_id``."""
    return [n for n, (i, _) in registry.items() if i == lora_id]


def labels_of(core: Any) -> dict[str, str]:
    """The adapter labels kept on engine core ``core`` (adapter name -> label; empty when none)."""
    return core.__dict__.get(_ATTR, {})


def set_label(core: Any, adapter: str, version: str) -> None:
    """Label ``adapter``'s weights ``version`` on engine core ``core`` (in its process), leaving the engine-wide
    label and the other adapters' as they are; from the next step, the step's label is the composite."""
    labels: dict[str, str] = core.__dict__.setdefault(_ATTR, {})
    labels[adapter] = version
    vllm_patches.wrap_weight_version_attach(core, lambda base: encode(base, labels))


def forget(core: Any, names: list[str]) -> list[str]:
    """Drop the labels of adapters ``names`` on ``core``; the names that had one."""
    labels = labels_of(core)
    return [n for n in names if labels.pop(n, None) is not None]


def forget_lora_id(registry: Mapping[str, tuple[int, str]], lora_id: int,
                   find_core: Any = vllm_patches.find_engine_core) -> list[str]:
    """A worker hook (vLLM is removing adapter ``lora_id``): forget the labels of the adapter names that
    ``registry`` (name -> (id, path), :data:`agentrl.engine.install.REGISTRY`) maps to it, on the engine core
    of this process (``find_core()``; none in a worker process of its own, whose engine core never labels per
    adapter). The names forgotten."""
    names = names_of(lora_id, registry)
    core = find_core() if names else None
    return [] if core is None else forget(core, names)


__all__ = ["ENV", "PREFIX", "adapter_name", "decode", "enabled", "encode", "forget", "forget_lora_id", "label_for", "labels_of",
           "names_of", "set_label"]
