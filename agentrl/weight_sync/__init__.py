"""Weight sync: making a trained policy version live in every engine (the publisher's half of each transport).

One module per transport, each with its publisher class and ``open_publisher(sync, target)``, paired with its
engine half (:mod:`agentrl.engine.transports`, same name) and its config class (:mod:`agentrl.config.sync`) by
:mod:`agentrl.weight_sync.registry`:

- :mod:`~agentrl.weight_sync.shm`: the adapter copied in place into the engines' LoRA slots through shared memory;
- :mod:`~agentrl.weight_sync.network`: the same, in the call body, for engines on other hosts;
- :mod:`~agentrl.weight_sync.file`: the adapter through files (the baseline);
- :mod:`~agentrl.weight_sync.merged`: the adapter merged by the engines into their base weights;
- :mod:`~agentrl.weight_sync.full`: full weights in buckets (:mod:`~agentrl.weight_sync.buckets` plans them);
- :mod:`~agentrl.weight_sync.nccl`: full weights over vLLM's NCCL weight-transfer engine.

What several transports share: :mod:`~agentrl.weight_sync.base` (the protocols, :class:`~agentrl.weight_sync.
base.PublishTarget`, the codes of the engines' failure records), :mod:`~agentrl.weight_sync.inplace` (the packed
layout and the workers' records), :mod:`~agentrl.weight_sync.hosts` (which engines share this host's memory),
:mod:`~agentrl.weight_sync.control` (the engines' local control sockets), :mod:`~agentrl.weight_sync.rotation`
(engines in and out of rotation around a load) and :mod:`~agentrl.weight_sync.worker_io` (mapping a segment and
the failure record, shared by the engine side and the trainer).
"""
