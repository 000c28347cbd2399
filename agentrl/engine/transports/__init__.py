"""The engine halves of the weight-sync transports, one module each, named as its publisher half in
:mod:`agentrl.weight_sync` (the registry, :mod:`agentrl.weight_sync.registry`, pairs them):

- :mod:`~agentrl.engine.transports.shm`: the adapter copied in place from the publisher's shared memory;
- :mod:`~agentrl.engine.transports.network`: the same from the call body, and an adapter's files written;
- :mod:`~agentrl.engine.transports.merged`: the adapter merged into the base weights;
- :mod:`~agentrl.engine.transports.full`: full weights loaded in buckets.

The ``file`` and ``nccl`` transports have no module here: their engine half is vLLM's own API (runtime LoRA
loading; the NCCL weight-transfer engine). Each module is a worker-extension mixin of
:class:`agentrl.engine.extension.WorkerExtension`, and imports without vLLM and torch.
"""
