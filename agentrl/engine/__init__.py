"""The vLLM boundary: all the code that runs inside a vLLM engine, and every use of vLLM's private API.

- :mod:`agentrl.engine.extension`: :class:`~agentrl.engine.extension.WorkerExtension`, the worker extension
  every agentrl-started vLLM server loads (``--worker-extension-cls agentrl.engine.extension.WorkerExtension``);
  it combines
- :mod:`agentrl.engine.transports`: the engine half of each weight-sync transport (``shm``, ``network``,
  ``merged``, ``full``; what the slot transports share is :mod:`agentrl.engine.slots`, the copy is planned by
  :mod:`agentrl.engine.adapter_plan`, a merge by :mod:`agentrl.engine.merge`), and
- :mod:`agentrl.engine.routing` (MoE routing capture, done by :mod:`agentrl.engine.capture`);
- :mod:`agentrl.engine.vllm_patches`: every monkeypatch, per-instance wrap and private lookup of vLLM, in one
  module, each recorded with the vLLM version it was written for and the targets it touches
  (:mod:`agentrl.engine.contract`; ``tests/unit/engine/test_vllm_contract.py`` checks every target against
  the installed vLLM);
- :mod:`agentrl.engine.install` installs them once per worker process, after
  :mod:`agentrl.engine.version_gate` checked the version.

**The version contract.** The patches are written for one vLLM version (``WRITTEN_FOR_VLLM``, 0.32.0; a local
build tag such as ``+cpu`` is ignored). On any other version the extension installs none of them: it prints
the refusal to the engine's log, and every method that needs them answers with the failure record
``{"ok": false, "code": "inference.vllm_version_refused", "error": ...}``, whose message names both versions
and the override. The override: set ``AGENTRL_ALLOW_VLLM_VERSION`` to the running vLLM version (or to
``any``) in the engine's environment (it is read in the engine process, so for a server agentrl starts, in
the environment of ``agentrl``), after checking the patches against that vLLM's source. Methods that need
no patch (``agentrl_write_adapter``, ``agentrl_probe_shm``, ``agentrl_lora_stats``, ``agentrl_lora_checksum``,
``agentrl_weight_dtype``) keep working, and so does adapter sync through files.

The engine-side modules' old internal paths under ``agentrl.weight_sync`` and ``agentrl.moe`` are gone: they
sat below this package and would have imported it back up.

Every module here imports without vLLM and torch (the launcher imports the extension to check it); vLLM is
only imported inside functions that run in a worker.
"""
