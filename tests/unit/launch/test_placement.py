"""The placement planner: devices for every process, impossible plans refused before anything starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentrl.config.run import load_config
from agentrl.launch.placement import PlacementError, format_devices, parse_devices, plan_run, visible_gpus


def cfg(**over: Any):
    return load_config(None, {"env": "calc", **over}).resolved()


def gpus(n: int) -> list[str]:
    return [str(i) for i in range(n)]


def test_device_lists() -> None:
    assert parse_devices("0-3,6") == [0, 1, 2, 3, 6]
    assert format_devices([0, 1, 2, 3, 6, 8, 9]) == "0-3,6,8-9"
    for bad, why in (("3-1", "backwards"), ("0,0", "more than once"), ("a", "not a device list")):
        with pytest.raises(PlacementError, match=why):
            parse_devices(bad)


def test_visible_gpus_follow_cuda_visible_devices() -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,GPU-ab12"}) == ["2", "GPU-ab12"]


def test_cpu_plan_and_gpu_flags_without_gpus() -> None:
    plan = plan_run(cfg(), gpus=[])
    assert [p.name for p in plan.processes] == ["vllm-0", "trainer"]
    assert all(p.devices == [] and p.env == {} for p in plan.processes)
    assert any("share the CPU cores" in n for n in plan.notes)
    with pytest.raises(PlacementError, match="no GPU is visible"):
        plan_run(cfg(placement={"trainer_gpus": "0"}), gpus=[])


def test_explicit_split_one_server_per_tensor_parallel_group() -> None:
    c = cfg(placement={"inference_gpus": "0-3", "trainer_gpus": "4-7"}, inference={"tensor_parallel_size": 2})
    plan = plan_run(c, gpus=gpus(8))
    assert [(s.name, s.env["CUDA_VISIBLE_DEVICES"], s.tensor_parallel_size) for s in plan.servers] == [
        ("vllm-0", "0,1", 2), ("vllm-1", "2,3", 2)]
    assert plan.trainer.nproc == 4 and plan.trainer.env == {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert all(s.gpu_memory_utilization == 0.85 for s in plan.servers)  # no GPU shared: the user's share
    text = plan.render()
    assert "vllm-1" in text and "GPU 2-3" in text and "4 rank(s)" in text


def test_fixed_port_counts_up_per_server() -> None:
    c = cfg(placement={"inference_gpus": "0-1", "trainer_gpus": "2"}, inference={"port": 8000})
    assert [s.port for s in plan_run(c, gpus=gpus(3)).servers] == [8000, 8001]


@pytest.mark.parametrize(("over", "n", "match"), [
    ({"placement": {"inference_gpus": "0-2"}, "inference": {"tensor_parallel_size": 2}}, 8, "not a multiple"),
    ({"placement": {"trainer_gpus": "6-9"}}, 8, r"names GPU\(s\) \[8, 9\]"),
    ({"placement": {"inference_gpus": "0-1", "trainer_gpus": "1-2"},
      "inference": {"gpu_memory_utilization": 0.85}}, 4, "at most 0.5"),
    ({"placement": {"inference_gpus": "0", "trainer_gpus": "1-3"}, "nproc": 2}, 4, "--nproc 2 contradicts"),
    ({"placement": {"trainer_gpus": "0-3"}}, 4, "leaves no GPU for the vLLM server"),
    ({"placement": {"inference_gpus": "0"}, "endpoints": ["http://10.0.0.1:8000"]}, 2, "none is started"),
    ({"inference": {"tensor_parallel_size": 4}}, 2, "needs 4 GPUs"),
    ({"placement": {"trainer_gpus": "0"}, "trainer": {"device": "cpu"}}, 2, "trainer.device = 'cpu'"),
])
def test_impossible_plans_are_refused(over: dict[str, Any], n: int, match: str) -> None:
    with pytest.raises(PlacementError, match=match):
        plan_run(cfg(**over), gpus=gpus(n))


def test_automatic_split() -> None:
    plan = plan_run(cfg(), gpus=gpus(8))
    assert [s.devices for s in plan.servers] == [[0], [1], [2], [3]] and plan.trainer.devices == [4, 5, 6, 7]
    plan = plan_run(cfg(inference={"tensor_parallel_size": 4}), gpus=gpus(6))
    assert [s.devices for s in plan.servers] == [[0, 1, 2, 3]] and plan.trainer.devices == [4, 5]
    # only one side given: the other takes what is left, rounded to whole tensor-parallel groups
    plan = plan_run(cfg(placement={"trainer_gpus": "0"}, inference={"tensor_parallel_size": 2}), gpus=gpus(4))
    assert [s.devices for s in plan.servers] == [[1, 2]] and plan.trainer.devices == [0]


def test_one_gpu_is_shared_with_a_smaller_vllm_share() -> None:
    plan = plan_run(cfg(), gpus=gpus(1))
    assert plan.servers[0].devices == plan.trainer.devices == [0]
    assert plan.servers[0].gpu_memory_utilization == 0.45
    assert any("shared by vLLM and the trainer" in n for n in plan.notes)
    plan = plan_run(cfg(inference={"gpu_memory_utilization": 0.3}), gpus=gpus(1))
    assert plan.servers[0].gpu_memory_utilization == 0.3  # the user's own share stands when it fits


def test_endpoints_leave_every_gpu_to_the_trainer() -> None:
    plan = plan_run(cfg(endpoints=["http://10.0.0.1:8000"]), gpus=gpus(4))
    assert plan.servers == [] and plan.trainer.devices == [0, 1, 2, 3] and plan.trainer.nproc == 4
    assert "existing server" in plan.render()


def test_indices_map_through_the_parents_visible_devices() -> None:
    c = cfg(placement={"inference_gpus": "0-1", "trainer_gpus": "2-3"})
    plan = plan_run(c, gpus=["3", "5", "7", "9"])
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in plan.servers] == ["3", "5"]
    assert plan.trainer.env["CUDA_VISIBLE_DEVICES"] == "7,9"


def _cli(*args: str, gpus_env: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus_env}
    return subprocess.run([sys.executable, "-m", "agentrl.cli", "train", "--env", "calc", "--dry-run", *args],
                          capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


def test_dry_run_prints_the_plan_and_starts_nothing(tmp_path: Path) -> None:
    r = _cli("--inference-gpus", "0-1", "--trainer-gpus", "2-3", gpus_env="0,1,2,3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout.strip().splitlines()[-1])
    assert [(p["name"], p["env"]) for p in plan["processes"]] == [
        ("vllm-0", {"CUDA_VISIBLE_DEVICES": "0"}), ("vllm-1", {"CUDA_VISIBLE_DEVICES": "1"}),
        ("trainer", {"CUDA_VISIBLE_DEVICES": "2,3"})]
    assert "trainer" in r.stdout and "GPU 2-3" in r.stdout
    assert list(tmp_path.iterdir()) == [], "--dry-run must not create anything"
    r = _cli("--trainer-gpus", "0-5", gpus_env="0,1", cwd=tmp_path)
    assert r.returncode == 2 and "--trainer-gpus 0-5" in r.stderr and "only 2 are visible" in r.stderr


def test_multi_node_trainer_command_and_plan_note() -> None:
    from agentrl.config.trainer import DistributedConfig
    from agentrl.trainer.launch import torchrun_command

    one = torchrun_command(Path("c.json"), 2, DistributedConfig(), 29500, "r1")
    assert one[one.index("--nnodes") + 1] == "1" and "--master_port" in one and "--rdzv-backend" not in one
    d = DistributedConfig(nnodes=2, master_addr="10.0.0.5", master_port=29400)
    two = torchrun_command(Path("c.json"), 4, d, 29400, "r1")
    assert two[two.index("--rdzv-endpoint") + 1] == "10.0.0.5:29400" and two[two.index("--rdzv-backend") + 1] == "c10d"
    assert two[two.index("--nproc_per_node") + 1] == "4" and two[-2:] == ["--config", "c.json"]
    assert "is_host=true" in two[two.index("--rdzv-conf") + 1], "the orchestrator's node hosts the store"
    assert two[two.index("--local-addr") + 1] == "10.0.0.5", "reached at master_addr, not at its host name"
    joiner = torchrun_command(Path("c.json"), 4, d, 29400, "r1", hosts_rendezvous=False)
    assert "is_host=false" in joiner[joiner.index("--rdzv-conf") + 1] and "--local-addr" not in joiner
    joiner = torchrun_command(Path("c.json"), 4, d, 29400, "r1", hosts_rendezvous=False, local_addr="10.0.0.6")
    assert joiner[joiner.index("--local-addr") + 1] == "10.0.0.6"
    with pytest.raises(ValueError, match="master_port must be set"):
        DistributedConfig(nnodes=2)
    plan = plan_run(cfg(trainer={"distributed": {"nnodes": 2, "master_port": 29400}}), gpus=[])
    assert any("agentrl trainer-node --join" in n for n in plan.notes)
