"""CPU pinning of the inference server and the trainer (disaggregation on one CPU machine)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from agentrl.config.trainer import TrainerConfig
from agentrl.inference import VLLMServer, VLLMServerConfig
from agentrl.trainer.launch import count_cores


def test_server_command_is_pinned_with_taskset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    server = VLLMServer(VLLMServerConfig(model="org/model", cpu_cores="0-1"), tmp_path)
    cmd = server.build_command()
    assert cmd[:3] == ["taskset", "-c", "0-1"] and cmd[4] == "-m" and "--model" in cmd
    assert server._env()["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    plain = VLLMServer(VLLMServerConfig(model="org/model"), tmp_path)
    assert plain.build_command()[0] != "taskset" and "VLLM_CPU_OMP_THREADS_BIND" not in plain._env()


@pytest.mark.parametrize("bad", ["", "a", "0-", "1,,2", "0;rm -rf /"])
def test_core_lists_are_validated(bad: str) -> None:
    with pytest.raises(ValidationError):
        VLLMServerConfig(model="m", cpu_cores=bad)
    with pytest.raises(ValidationError):
        TrainerConfig(model_path="m", cpu_cores=bad)


def test_count_cores() -> None:
    assert count_cores("0") == 1 and count_cores("0-3,6") == 5 and count_cores("2,4-5") == 3


def test_engines_and_trainer_ranks_spin_briefly_unless_told_otherwise(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine and the ranks share cores on a CPU machine: each gets libgomp's short spin, and a value the
    user set in the environment is kept."""
    from agentrl.core.utils.threads import SPIN
    from agentrl.trainer.launch import worker_env

    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    server = VLLMServer(VLLMServerConfig(model="m"), tmp_path)
    assert server._env()["GOMP_SPINCOUNT"] == SPIN["GOMP_SPINCOUNT"]
    assert worker_env("127.0.0.1:1", b"k")["GOMP_SPINCOUNT"] == SPIN["GOMP_SPINCOUNT"]
    monkeypatch.setenv("GOMP_SPINCOUNT", "123")
    assert server._env()["GOMP_SPINCOUNT"] == "123"
    assert worker_env("127.0.0.1:1", b"k")["GOMP_SPINCOUNT"] == "123"
