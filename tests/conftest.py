"""Shared test policy: integration tests skip locally when a service is missing, and fail on CI."""

from __future__ import annotations

import os

import pytest

ON_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# The suite never reaches an outside host: the trackers and the Hugging Face hub run offline, analytics off
# (set before any test imports them; child processes such as vLLM servers inherit it).
os.environ.update({
    "WANDB_MODE": "offline", "WANDB_SILENT": "true", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1", "GRADIO_ANALYTICS_ENABLED": "False", "DO_NOT_TRACK": "1",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
})


def pytest_configure(config: pytest.Config) -> None:
    """Trackio's local store, which it reads once at import: a directory of this session's."""
    import tempfile

    config._agentrl_trackio_dir = tempfile.mkdtemp(prefix="agentrl-tests-trackio-")  # type: ignore[attr-defined]
    os.environ["TRACKIO_DIR"] = config._agentrl_trackio_dir  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    shutil.rmtree(getattr(config, "_agentrl_trackio_dir", ""), ignore_errors=True)


def require(ok: bool, reason: str) -> None:
    """Skip (locally) or fail (on CI, where every service must be present) unless ``ok``."""
    if ok:
        return
    if ON_CI:
        pytest.fail(f"required service missing on CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def tiny_tokenizer_model(tmp_path_factory: pytest.TempPathFactory):
    """A random tiny model directory with tokenizer (no warm-up): for tests that need a valid directory."""
    from tests.fixtures_model import build_random_tiny_model

    return build_random_tiny_model(tmp_path_factory.mktemp("random-tiny"))
