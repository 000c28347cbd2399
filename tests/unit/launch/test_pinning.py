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
    assert cmd[:3] == ["taskset", "-c", "0-1"] and "vllm.entrypoints.openai.api_server" in cmd
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
