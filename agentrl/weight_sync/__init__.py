"""Weight sync: making a trained policy version live in every engine (the publisher's half).

- :mod:`agentrl.weight_sync.base`: what a publisher needs from the trainer and the engines (protocols), and
  the codes of the engine's failure records;
- :mod:`agentrl.weight_sync.file`: through adapter files (the baseline);
- :mod:`agentrl.weight_sync.shm`: through POSIX shared memory, copied in place on the engine's host;
- :mod:`agentrl.weight_sync.network`: in the request body, for engines on other hosts;
- :mod:`agentrl.weight_sync.full`: full weights, in buckets through shared memory or the network
  (:mod:`agentrl.weight_sync.buckets` plans them);
- :mod:`agentrl.weight_sync.route`: which path each engine gets;
- :mod:`agentrl.weight_sync.worker_io`: mapping the publisher's shared memory and the failure record, shared
  by the engine side and the trainer.

The engine half (the vLLM worker extension that copies an adapter in place or loads full weights, and every
vLLM patch) is :mod:`agentrl.engine`, one layer up: it reads this package's failure codes and buffer layout.
"""
