"""Weight sync: making a trained policy version live in every engine, and the engine half that loads it.

- :mod:`agentrl.weight_sync.base`: what a publisher needs from the trainer and the engines (protocols);
- :mod:`agentrl.weight_sync.file`: through adapter files (the baseline);
- :mod:`agentrl.weight_sync.shm`: through POSIX shared memory, copied in place on the engine's host;
- :mod:`agentrl.weight_sync.network`: in the request body, for engines on other hosts;
- :mod:`agentrl.weight_sync.full`: full weights, in buckets through shared memory or the network
  (:mod:`agentrl.weight_sync.buckets` plans them);
- :mod:`agentrl.weight_sync.route`: which path each engine gets;
- :mod:`agentrl.weight_sync.vllm_ext`: the vLLM worker extension that copies an adapter in place, with the
  full-weight loading methods of :mod:`agentrl.weight_sync.vllm_full` (both share
  :mod:`agentrl.weight_sync.worker_io`);
- :mod:`agentrl.weight_sync.vllm_patches`: every patch of vLLM internals, with the version it was written for.
"""
