"""The ``network`` transport's engine half: the worker decodes a LoRA adapter's packed tensors from the call
body (an engine on another host than the publisher's) and copies them in place into the adapter's live slot,
and writes an adapter's files sent in the call for an engine that has no slot yet.

The publisher half is :mod:`agentrl.weight_sync.network`. This module must import without vLLM and torch (the
launcher imports the extension to check it).
"""

from __future__ import annotations

import base64
import json
import os
import re
import tempfile
import time
from typing import Any

from agentrl.core.errors import WeightSyncError
from agentrl.engine.adapter_plan import UpdateError, decode_payload
from agentrl.engine.install import needs_patches
from agentrl.engine.slots import SlotsMixin
from agentrl.weight_sync.base import WRITE_FAILED
from agentrl.weight_sync.worker_io import failure, failure_of

_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
"""A file or directory name sent by the publisher: one path segment, no traversal."""


class AdapterWriteError(WeightSyncError, ValueError):
    """The adapter files sent to the engine cannot be written: a name that is not one path segment.
    ``agentrl_write_adapter`` returns it as a failure record carrying its ``code``."""

    code = WRITE_FAILED


class NetworkEngine(SlotsMixin):
    """The ``network`` transport's worker methods (called through ``collective_rpc``, string args)."""

    @needs_patches
    def agentrl_update_lora_bytes(self, adapter: str, payload_b64: str, meta_json: str, layout_id: str = "",
                                  weight_version: str = "", reset_prefix_cache: str = "") -> dict[str, Any]:
        """As :meth:`agentrl.engine.transports.shm.ShmEngine.agentrl_update_lora`, with the packed tensors in the
        call itself (base64 of the same layout), for an engine that cannot map the publisher's shared memory
        (another host). The bytes are
        decoded into a buffer of this worker that is reused while the layout stays the same, so the copy
        plan is built once. The result also carries ``decode_ms``."""
        t0 = time.perf_counter()
        try:
            key = f"net:{layout_id or meta_json}"
            buf, new = decode_payload(self.__dict__.setdefault("_agentrl_netbufs", {}), key, payload_b64,
                                      int(json.loads(meta_json)["nbytes"]))
            if new:
                self.__dict__["_agentrl_plans"] = {}  # plans hold views into the older buffer
        except (UpdateError, ValueError) as exc:
            return failure_of(exc)
        decode_ms = (time.perf_counter() - t0) * 1e3
        out = self._agentrl_apply(time.perf_counter(), adapter, key, lambda meta: buf, meta_json, layout_id,
                                  weight_version, reset_prefix_cache)
        out["decode_ms"] = decode_ms
        return out

    def agentrl_write_adapter(self, dir_name: str, files_json: str) -> dict[str, Any]:
        """Write an adapter directory sent in the call (``{file name: base64}``) under this host's temporary
        directory and return its path, for ``load_lora_adapter`` on an engine that cannot read the
        publisher's files. ``dir_name`` and the file names are single path segments."""
        try:
            files = json.loads(files_json)
            names = [dir_name, *files]
            if not all(isinstance(n, str) and _SEGMENT.match(n) for n in names):
                raise AdapterWriteError(f"names must be single path segments: {names}")
            root = os.path.join(tempfile.gettempdir(), "agentrl-adapters", dir_name)
            os.makedirs(root, exist_ok=True)
            for name, data in files.items():
                tmp = os.path.join(root, f".{name}.{os.getpid()}.tmp")
                with open(tmp, "wb") as f:
                    f.write(base64.b64decode(data, validate=True))
                os.replace(tmp, os.path.join(root, name))  # workers of one host may write the same files
        except (AdapterWriteError, ValueError, OSError) as exc:
            return failure(WRITE_FAILED, f"cannot write the adapter: {exc}")
        return {"ok": True, "path": root}
