"""The API server agentrl starts for a CPU engine whose one worker runs in its engine core
(``python -m agentrl.engine.serve`` with vLLM's own arguments): vLLM's OpenAI-compatible server, with the
engine-core process forked from it instead of spawned (patch 12 of :mod:`agentrl.engine.vllm_patches`), so it
does not import vLLM and torch a second time. The forked engine core closes its copy of the server's socket at
once: otherwise, after the API server died, the port stays taken (a restart on it fails) for as long
as the engine core takes to die. Each request's weight-version spans carry the label of the LoRA adapter it
names where that adapter has one of its own (patch 20, :mod:`agentrl.engine.adapter_labels`). On another vLLM
than the patches were written for (and no override, :mod:`agentrl.engine.version_gate`) it serves unpatched:
the engine core is spawned, as vLLM does, and in-place syncs set the engine-wide label.
"""

from __future__ import annotations

import os
import sys

from agentrl.core.utils.procs import close_server_sockets
from agentrl.engine import adapter_labels, vllm_patches
from agentrl.engine.version_gate import VLLMVersionRefused


def main() -> None:
    try:
        vllm_patches.check_vllm_version()
    except VLLMVersionRefused as e:
        print(f"agentrl: the engine core is spawned, not forked: {e}", file=sys.stderr, flush=True)
    else:
        vllm_patches.patch_cpu_engine_core_fork()
        vllm_patches.patch_cpu_compile_with_lora()
        os.register_at_fork(after_in_child=close_server_sockets)
        vllm_patches.patch_request_labels(adapter_labels.label_for)
        os.environ[adapter_labels.ENV] = "1"  # the engine core (its child) labels in-place syncs per adapter
    vllm_patches.run_api_server()


if __name__ == "__main__":
    main()
