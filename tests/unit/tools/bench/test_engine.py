"""The benchmarks' scratch directory: removed after a run that ends normally, kept after one that fails."""

from __future__ import annotations

import shutil

import pytest

from agentrl.tools.bench.engine import scratch_dir


def test_scratch_dir_is_removed_after_a_normal_run() -> None:
    with scratch_dir("agentrl-test-scratch-") as work:
        (work / "trainer.log").write_text("ok")
        assert work.is_dir() and work.name.startswith("agentrl-test-scratch-")
    assert not work.exists()


def test_scratch_dir_is_kept_with_its_logs_after_a_failure(caplog) -> None:
    with pytest.raises(RuntimeError, match="engine died"), scratch_dir("agentrl-test-scratch-") as work:
        (work / "vllm.log").write_text("traceback")
        raise RuntimeError("engine died")
    try:
        assert (work / "vllm.log").read_text() == "traceback"
        assert str(work) in caplog.text
    finally:
        shutil.rmtree(work)
