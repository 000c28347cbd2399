"""agentrl's vLLM worker extension: the one class every agentrl-started vLLM server loads.

Start vLLM with ``--worker-extension-cls agentrl.engine.extension.WorkerExtension`` (the default of
``VLLMServerConfig.worker_extension``) and ``VLLM_SERVER_DEV_MODE=1``; then ``POST /collective_rpc`` with
``{"method": "agentrl_...", ...}`` runs one of its methods on every worker:

- the engine halves of the weight-sync transports (:mod:`agentrl.engine.transports`, paired with their
  publishers by :mod:`agentrl.weight_sync.registry`): ``shm`` (:class:`~agentrl.engine.transports.shm.ShmEngine`:
  ``agentrl_update_lora``, ``agentrl_probe_shm``), ``network``
  (:class:`~agentrl.engine.transports.network.NetworkEngine`: ``agentrl_update_lora_bytes``,
  ``agentrl_write_adapter``), ``merged`` (:class:`~agentrl.engine.transports.merged.MergedEngine`:
  ``agentrl_merge_lora``, ``agentrl_merge_lora_bytes``) and ``full``
  (:class:`~agentrl.engine.transports.full.FullEngine`: ``agentrl_begin_weights``, ``agentrl_load_weights``,
  ``agentrl_load_weights_bytes``, ``agentrl_finish_weights``, ``agentrl_load_weights_from_path``,
  ``agentrl_weight_dtype``), with what the slot transports share (:class:`agentrl.engine.slots.SlotsMixin`:
  ``agentrl_lora_stats``, ``agentrl_lora_checksum``);
- the local control socket (:class:`agentrl.engine.control.ControlMixin`: ``agentrl_open_control``): the
  hot sync sequence without HTTP, for a publisher on the engine's host;
- MoE routing capture (:class:`agentrl.engine.routing.RoutingCaptureMixin`: ``agentrl_routing_enable``,
  ``agentrl_routing_take``);
- sampling-mask capture (:class:`agentrl.engine.masks.SamplingMaskMixin`: ``agentrl_masks_enable``,
  ``agentrl_masks_take``).

Importing this module inside a vLLM worker (vLLM imports it there, before any adapter or model loads)
installs the vLLM patches (:mod:`agentrl.engine.vllm_patches`) once, after the version check
(:mod:`agentrl.engine.version_gate`); see :mod:`agentrl.engine.install` for what a refusal does.

This module must import without vLLM and torch (the launcher imports it to check it).
"""

from __future__ import annotations

import sys

from agentrl.engine.control import ControlMixin
from agentrl.engine.install import install_in_worker
from agentrl.engine.masks import SamplingMaskMixin
from agentrl.engine.routing import RoutingCaptureMixin
from agentrl.engine.transports.full import FullEngine
from agentrl.engine.transports.merged import MergedEngine
from agentrl.engine.transports.network import NetworkEngine
from agentrl.engine.transports.shm import ShmEngine

if "vllm" in sys.modules:  # inside a vLLM worker (vLLM imports this module): hook before any adapter loads
    install_in_worker()


class WorkerExtension(ShmEngine, NetworkEngine, MergedEngine, FullEngine, ControlMixin, RoutingCaptureMixin,
                      SamplingMaskMixin):
    """Mixed into vLLM's worker class; methods are called through ``collective_rpc`` (string args only)."""


__all__ = ["WorkerExtension"]
