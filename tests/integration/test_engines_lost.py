"""A run whose engine's host is cut off, across real network boundaries: the engine runs on a host of its own
(a network namespace behind a veth pair, with its own ``/dev/shm``, so the start-up probe must choose the
network weight-sync path), the env server on another, and the trainer spans two nodes: the driver's node here
and a second one on a third host, joined with ``agentrl trainer-node`` (c10d rendezvous, gloo and rank 0's
connection to the orchestrator cross the link).

Cut once, the engine leaves the rotation and, when its link returns, rejoins at the current policy version;
the run goes on. Cut for good, the run waits its bounded time (``[engine_health] lost_after_s``) and stops
with a checkpoint; once the link is back, ``--resume`` finishes the run on the same engine."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from agentrl.inference import VLLMServer, VLLMServerConfig
from agentrl.orchestrator.metrics import read_jsonl
from agentrl.trainer.launch import JOIN_FILE, _free_port
from tests import hosts as hosts_mod
from tests.conftest import require
from tests.hosts import Host
from tests.unit.environment.test_loading import AGENTRL

pytestmark = [pytest.mark.integration, pytest.mark.long]

ENV_TOKEN = "lost-engine-env-token-0123456789"
RUN_TOML = """steps = 6
tasks_per_step = 2
group_size = 2
eval_size = 2
eval_every = 0
checkpoint_every = 0
engine_warmup = false

[trainer]
lora_train_embedding = false  # the adapter path, synced in place

[engine_health]
interval_s = 1.0
timeout_s = 2.0
failures_to_drop = 2
lost_after_s = 10.0

[trainer.distributed]
nnodes = 2
master_addr = "{here}"
master_port = {port}
orchestrator_addr = "{here}"
"""


class HostedServer(VLLMServer):
    """A vLLM server started on ``host`` (bound to every address there), reached at the host's address."""

    def __init__(self, cfg: VLLMServerConfig, log_dir: Path, host: Host) -> None:
        super().__init__(cfg.model_copy(update={"host": "0.0.0.0"}), log_dir)
        self.host = host

    @property
    def url(self) -> str:
        return f"http://{self.host.addr}:{self.port}"

    def build_command(self) -> list[str]:
        return self.host.command(super().build_command())


def _train_steps(metrics: Path) -> list[int]:
    try:
        return [r["step"] for r in read_jsonl(metrics) if r.get("kind") == "train"]
    except (OSError, ValueError):
        return []


class SecondNode:
    """The trainer's second node on ``host``: ``agentrl trainer-node`` started once the run's join file exists
    (each start of the run writes a new one)."""

    def __init__(self, host: Host, run_dir: Path, work: Path, env: dict[str, str]) -> None:
        self.host, self.join, self.work = host, run_dir / JOIN_FILE, work
        # gloo finds its own address through the interface named here (the host name resolves to neither end)
        self.env = {**env, "GLOO_SOCKET_IFNAME": host.ifname}
        self.proc: subprocess.Popen | None = None

    def start_when_asked(self, driver: subprocess.Popen, err: Path) -> None:
        _wait("the run's join file", self.join.is_file, driver, err, 300)
        self.work.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            self.host.command([AGENTRL, "trainer-node", "--join", str(self.join), "--work-dir", str(self.work),
                               "--local-addr", self.host.addr]),
            env=self.env, stdout=(self.work / "node.log").open("a"), stderr=subprocess.STDOUT,
            start_new_session=True)

    def wait(self, timeout_s: float) -> int:
        """The node's exit code: it ends by itself when the run's trainer shuts down."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired as e:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
            log = (self.work / "node.log").read_text()[-3000:]
            raise AssertionError(f"the second node outlived its run: {log}") from e

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()


def _wait(what: str, ok: Callable[[], bool], driver: subprocess.Popen, err: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert driver.poll() is None, f"the run ended before {what}: {err.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"not {what} after {timeout_s:.0f} s: {err.read_text()[-3000:]}"
        time.sleep(0.1)


def test_an_engine_host_cut_off_rejoins_then_stops_the_run_with_a_checkpoint(tiny_model_dir: Path,
                                                                              tmp_path: Path) -> None:
    require(importlib.util.find_spec("vllm") is not None, "vLLM is not installed")
    missing = hosts_mod.missing()
    require(missing is None, f"cannot make hosts in network namespaces: {missing}")

    scfg = VLLMServerConfig(model=str(tiny_model_dir), dtype="float32", max_model_len=1024, max_lora_rank=16,
                            max_loras=2, startup_timeout_s=600)
    run_dir = tmp_path / "runs" / "lost"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["AGENTRL_ENV_TOKEN"] = ENV_TOKEN
    with hosts_mod.hosts(3) as (engine_host, env_host, node_host):
        (tmp_path / "run.toml").write_text(RUN_TOML.format(here=node_host.here, port=_free_port()))
        env["GLOO_SOCKET_IFNAME"] = node_host.link  # the driver's node: its end of the link to the second node
        node = SecondNode(node_host, run_dir, tmp_path / "node1", env)
        engine = HostedServer(scfg, tmp_path / "engine", engine_host)
        env_server = subprocess.Popen(
            env_host.command([AGENTRL, "serve-env", "--env", "calc", "--host", "0.0.0.0", "--port", "8765"]),
            env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / "env.err").open("w"), start_new_session=True)
        env_url = f"http://{env_host.addr}:8765"
        try:
            engine.start()
            for _ in range(300):
                try:
                    if httpx.get(f"{env_url}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert env_server.poll() is None, (tmp_path / "env.err").read_text()[-2000:]
                time.sleep(0.2)

            def train(*extra: str) -> list[str]:
                return [AGENTRL, "train", "--env", "calc", "--name", "lost", "--model", str(tiny_model_dir),
                        "--endpoint", engine.url, "--env-url", env_url, "--config", "run.toml", *extra]

            err = tmp_path / "first.err"
            with err.open("w") as err_f:
                driver = subprocess.Popen(train(), cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=err_f,
                                          text=True, start_new_session=True)
            try:
                node.start_when_asked(driver, err)
                _wait("a training step", lambda: bool(_train_steps(run_dir / "metrics.jsonl")), driver, err, 600)
                # a blip: the engine's host is unreachable until the run takes it out of rotation
                engine_host.cut()
                _wait("the engine out of rotation", lambda: "out of rotation" in err.read_text(), driver, err, 60)
                engine_host.restore()
                _wait("the engine rejoined", lambda: "rejoined at version" in err.read_text(), driver, err, 60)
                done_before = len(_train_steps(run_dir / "metrics.jsonl"))
                _wait("a step after the rejoin", lambda: len(_train_steps(run_dir / "metrics.jsonl")) > done_before,
                      driver, err, 300)
                # lost for good: the run waits lost_after_s, then stops with a checkpoint
                engine_host.cut()
                t_cut = time.monotonic()
                driver.communicate(timeout=400)
                waited = time.monotonic() - t_cut
            finally:
                if driver.poll() is None:
                    os.killpg(driver.pid, 9)
                    driver.wait()
            stderr = err.read_text()
            assert driver.returncode == 2, stderr[-3000:]
            assert "no inference engine" in stderr and "--resume" in stderr, stderr[-3000:]
            assert "Traceback" not in stderr, stderr[-3000:]
            assert waited >= 10.0, f"the run stopped {waited:.1f} s after the cut, before lost_after_s"
            ckpts = sorted((run_dir / "checkpoints").glob("step_*/state.json"))
            assert ckpts, "the stopped run saved a checkpoint"
            stopped_at = _train_steps(run_dir / "metrics.jsonl")[-1]
            assert json.loads(ckpts[-1].read_text())["step"] == stopped_at and 2 <= stopped_at < 6, stopped_at
            metas = list(ckpts[-1].parent.rglob("agentrl_meta.json"))
            assert metas and json.loads(metas[0].read_text())["world_size"] == 2, "the trainer spans both nodes"
            assert list(ckpts[-1].parent.rglob("rng_rank1.pt")), "the second node's rank saved its part"
            run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
            assert node.wait(60) == 0, "the second node ends cleanly with the stopped run's trainer"

            engine_host.restore()  # the same engine, back: the resumed run gives it the saved policy first
            (run_dir / JOIN_FILE).unlink()  # the resumed run writes its own: the second node joins it again
            err = tmp_path / "resumed.err"
            with err.open("w") as err_f:
                resumed = subprocess.Popen(train("--resume"), cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                           stderr=err_f, text=True, start_new_session=True)
            try:
                node.start_when_asked(resumed, err)
                out, _ = resumed.communicate(timeout=900)
            finally:
                if resumed.poll() is None:
                    os.killpg(resumed.pid, 9)
                    resumed.wait()
            assert resumed.returncode == 0, err.read_text()[-3000:]
            assert node.wait(60) == 0, "the second node ends cleanly with the finished run's trainer"
            assert json.loads(out.splitlines()[-1])["steps"] == 6
        finally:
            node.kill()
            engine.stop()
            env_server.kill()
            env_server.wait()
    recs = read_jsonl(run_dir / "metrics.jsonl")
    assert {r["run_id"] for r in recs} == {run_id}, "one run"
    train_recs = [r for r in recs if r["kind"] == "train"]
    assert [r["step"] for r in train_recs] == [1, 2, 3, 4, 5, 6], "each step once"
    assert [r["version"] for r in train_recs] == [1, 2, 3, 4, 5, 6], "the resumed run goes on from the saved version"
    # the engine has a /dev/shm of its own: every weight update took the network path, chosen by the probe
    assert all("network_ms" in r and "total_ms" not in r for r in train_recs), train_recs[-1]
    assert (run_dir / "final_adapter" / "adapter_model.safetensors").is_file()
