"""Shared test policy: integration tests skip locally when a service is missing, and fail on CI."""

from __future__ import annotations

import os

import pytest

ON_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


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
