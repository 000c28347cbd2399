"""Session fixtures for integration tests: the embedded tiny model and ONE vLLM server for the whole session."""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require

log = logging.getLogger(__name__)


ROOT = Path(__file__).resolve().parents[2]


def tiny_model_config() -> dict:
    """The embedded tiny model's ``config.json`` (installed by :func:`tiny_model_dir`, which runs first)."""
    import json

    from agentrl.tools.modelgen import DEFAULT_TINY_DIR

    return json.loads((ROOT / DEFAULT_TINY_DIR / "config.json").read_text())


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The embedded tiny model (warmed up on calc): the pinned model, installed into this checkout's default
    directory (a no-op when it is in place), which ``make train`` uses too."""
    from agentrl.tools.modelgen import DEFAULT_TINY_DIR, TINY, install_pinned

    return install_pinned(ROOT / DEFAULT_TINY_DIR, TINY)


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """One vLLM server (LoRA enabled, dev RL routes, token-in/token-out route) shared by the session; its steps
    can be slowed for a test that pauses it mid-generation (``vllm_metrics.slowed_engine``)."""
    require(importlib.util.find_spec("vllm") is not None, "vLLM is not installed")
    from agentrl.inference import VLLMServer, VLLMServerConfig
    from tests.integration.vllm_metrics import STEP_DELAY_ARGS, STEP_DELAY_FLAG_ENV

    os.environ[STEP_DELAY_FLAG_ENV] = str(tmp_path_factory.getbasetemp() / "engine-step-delay")
    cfg = VLLMServerConfig(model=str(tiny_model_dir), dtype="float32", max_model_len=1024, enable_lora=True,
                           max_lora_rank=16, max_loras=4, startup_timeout_s=300,
                           # room on the CPU for more adapters than slots: a test pushes one out of its slot only
                           extra_args=[*STEP_DELAY_ARGS, "--max-cpu-loras", "8"])
    server = VLLMServer(cfg, tmp_path_factory.mktemp("vllm-logs"))
    server.start()
    log.info("vLLM server %s ready in %.1fs", server.url, server.startup_s or -1)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def weights_engine(vllm_server: Any, tiny_model_dir: Path) -> Iterator[Any]:
    """The session server, for a module whose tests replace its base weights: the model's own weights are
    loaded back (and the version label reset) after the module's tests, so the tests that follow see the engine
    they expect."""
    import asyncio

    from agentrl.inference import InferenceClient

    yield vllm_server

    async def restore() -> None:
        async with InferenceClient([vllm_server.url], timeout_s=300) as client:
            out = (await client.collective_rpc("agentrl_load_weights_from_path",
                                               kwargs={"path": str(tiny_model_dir)}, timeout=300))[0]
            assert all(w.get("ok") for w in out), out
            await client.reset_prefix_cache()
            await client.set_weight_version("0")

    asyncio.run(restore())
