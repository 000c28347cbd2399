"""``agentrl serve-tinker`` driven by the official tinker SDK (0.38.0), unmodified, on the embedded tiny model:
a real server process (owned, killed by its process group), real LoRA training, a real vLLM engine behind the
sampling client, two API keys, a restart on the same state directory."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import require

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]  # about 2 minutes in all

KEY_A = "tml-agentrl-test-key-a"
KEY_B = "tml-agentrl-test-key-b"
TOKENS = list(range(5, 29))
"""A fixed sequence of the tiny model's token ids (24 tokens)."""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    model: Path
    state: Path
    keys: Path
    log: Path
    url: str = ""
    proc: subprocess.Popen | None = None

    def start(self) -> Server:
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agentrl.cli", "serve-tinker", "--model", str(self.model), "--model-name", "tiny",
                 "--port", str(port), "--dir", str(self.state), "--api-keys", str(self.keys), "--max-rank", "16",
                 "--max-adapters", "2", "--seq-gap-timeout", "3"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"serve-tinker exited: {self.log.read_text()[-2000:]}"
            try:
                if httpx.get(f"{self.url}/api/v1/healthz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"serve-tinker not up in 120 s: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        """SIGKILL the whole process group (the server and its engine): nothing is saved on the way out."""
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            self.proc = None


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    require(importlib.util.find_spec("tinker") is not None, "the tinker SDK is not installed (pip install 'agentrl[tinker]')")
    require(importlib.util.find_spec("vllm") is not None, "vLLM is not installed")
    root = tmp_path_factory.mktemp("serve-tinker")
    keys = root / "keys.txt"
    keys.write_text(f"# test keys\n{KEY_A}\n{KEY_B}\n")
    srv = Server(tiny_model_dir, root / "state", keys, root / "server.log").start()
    try:
        yield srv
    finally:
        srv.kill()


def _client(srv: Server, key: str = KEY_A):
    import tinker

    return tinker.ServiceClient(base_url=srv.url, api_key=key)


def _datum(weights: bool = True, **extra: np.ndarray):
    from tinker import types

    inputs = {"target_tokens": np.array(TOKENS[1:], dtype=np.int64), **extra}
    if weights:
        inputs["weights"] = np.ones(len(TOKENS) - 1, dtype=np.float32)
    return types.Datum(model_input=types.ModelInput.from_ints(TOKENS[:-1]), loss_fn_inputs=inputs)


def _steps(tc, datum, loss_fn: str, n: int, lr: float = 2e-3) -> list[float]:
    from tinker import types

    out = []
    for _ in range(n):
        fb = tc.forward_backward([datum], loss_fn)
        opt = tc.optim_step(types.AdamParams(learning_rate=lr))  # submitted before waiting: the server orders them
        out.append(fb.result().metrics["loss:sum"])
        opt.result()
    return out


def test_training_clients_lower_their_loss(server: Server) -> None:
    """Two LoRA clients on one base model, each its own adapter and AdamW: cross_entropy and importance_sampling
    losses fall step by step on a fixed batch, and the clients do not disturb each other."""
    sc = _client(server)
    ce = sc.create_lora_training_client(base_model="tiny", rank=8, seed=0).result()
    rl = sc.create_lora_training_client(base_model="tiny", rank=8, seed=0).result()
    assert ce.model_id.endswith(":train:0") and rl.model_id.endswith(":train:1")
    info = ce.get_info()
    assert info.lora_rank == 8 and info.model_data.model_name == "tiny"
    ce_losses = _steps(ce, _datum(), "cross_entropy", 4)
    behaviour = rl.forward([_datum()], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    assert rl.forward([_datum()], "cross_entropy").result().metrics["loss:sum"] == pytest.approx(ce_losses[0], rel=1e-6)
    datum = _datum(weights=False, logprobs=behaviour.astype(np.float32),
                   advantages=np.ones(len(TOKENS) - 1, dtype=np.float32))
    rl_losses = _steps(rl, datum, "importance_sampling", 4)
    assert all(b < a for a, b in itertools.pairwise(ce_losses)), ce_losses
    assert rl_losses[0] == pytest.approx(-(len(TOKENS) - 1), rel=1e-5)  # ratio 1 at the behaviour policy
    assert all(b < a for a, b in itertools.pairwise(rl_losses)), rl_losses


def test_forward_backward_custom_and_the_named_losses(server: Server) -> None:
    """The SDK's client-side custom loss (a forward pass, then cross_entropy weighted by its gradient) and
    every loss by name answer ``loss:sum`` as hand-computed from the returned logprobs."""
    import torch

    tc = _client(server).create_lora_training_client(base_model="tiny", rank=4, seed=1).result()
    lp = tc.forward([_datum()], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()

    def square(data, logprobs):
        loss = sum((x ** 2).sum() for x in logprobs)
        return loss, {"square:sum": float(loss.detach())}

    out = tc.forward_backward_custom([_datum()], square).result()
    assert out.metrics["loss:sum"] == pytest.approx(float((torch.tensor(lp) ** 2).sum()), rel=1e-5)
    q = lp - 0.1  # the sampler's logprobs, a little off the learner's
    adv = np.linspace(-1, 1, len(lp)).astype(np.float32)
    datum = _datum(weights=False, logprobs=q.astype(np.float32), advantages=adv)
    r = np.exp(lp - q)
    expected = {"importance_sampling": -(r * adv).sum(),
                "ppo": -np.minimum(r * adv, np.clip(r, 0.8, 1.2) * adv).sum(),
                "cispo": -(np.clip(r, 0.8, 1.2) * lp * adv).sum(),
                "dro": -(lp * adv - 0.5 * 0.05 * (lp - q) ** 2).sum()}
    for name, want in expected.items():
        got = tc.forward([datum], name).result().metrics["loss:sum"]
        assert got == pytest.approx(float(want), rel=1e-4, abs=1e-4), name
    got = tc.forward([datum], "ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.05}).result()
    assert got.metrics["loss:sum"] == pytest.approx(float(-np.minimum(r * adv, np.clip(r, 0.9, 1.05) * adv).sum()),
                                                    rel=1e-4)


def test_a_sampler_reads_exactly_the_saved_weights(server: Server) -> None:
    """save_weights_for_sampler, then the SDK's sampling client: its prompt logprobs are the trainer's logprobs
    of the saved adapter (not the base model's), samples carry sequence ids, logprobs and stop reasons."""
    from tinker import types

    sc = _client(server)
    tc = sc.create_lora_training_client(base_model="tiny", rank=8, seed=2).result()
    _steps(tc, _datum(), "cross_entropy", 3)
    trained = tc.forward([_datum()], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    path = tc.save_weights_for_sampler("after-3").result().path
    assert path.startswith("tinker://") and path.endswith("/sampler_weights/after-3")
    sampler = sc.create_sampling_client(model_path=path).result()
    served = sampler.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()
    assert served[0] is None
    np.testing.assert_allclose(np.array(served[1:], dtype=np.float32), trained, atol=2e-4)
    base = sc.create_sampling_client(base_model="tiny").result()
    base_lps = base.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()
    assert np.abs(np.array(base_lps[1:]) - trained).max() > 0.1  # the adapter is what was served
    res = sampler.sample(types.ModelInput.from_ints(TOKENS[:6]), num_samples=2,
                         sampling_params=types.SamplingParams(max_tokens=5, temperature=0.0, stop=[]),
                         include_prompt_logprobs=True).result()
    assert len(res.sequences) == 2 and len({s.sequence_id for s in res.sequences}) == 2
    for seq in res.sequences:
        assert len(seq.tokens) == 5 and len(seq.logprobs) == 5 and seq.stop_reason == "length"
    assert res.sequences[0].tokens == res.sequences[1].tokens  # greedy
    np.testing.assert_allclose(np.array(res.prompt_logprobs[1:], dtype=np.float32), trained[:5], atol=2e-4)
    # a save with no name hands back a sampling client at once, on the adapter as it is now
    _steps(tc, _datum(), "cross_entropy", 1)
    later = tc.forward([_datum()], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    live = tc.save_weights_and_get_sampling_client().result()
    now = live.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()
    np.testing.assert_allclose(np.array(now[1:], dtype=np.float32), later, atol=2e-4)


def test_a_second_key_sees_nothing_of_the_first(server: Server) -> None:
    import tinker

    tc = _client(server, KEY_A).create_lora_training_client(base_model="tiny", rank=4).result()
    ckpt = tc.save_state("mine").result().path
    h_b = {"X-API-Key": KEY_B}
    r = httpx.post(f"{server.url}/api/v1/get_info", json={"model_id": tc.model_id}, headers=h_b)
    assert r.status_code == 404 and "no model" in r.json()["message"]
    with pytest.raises(tinker.NotFoundError, match="no checkpoint"):
        _client(server, KEY_B).create_training_client_from_state(ckpt).result()
    fut = httpx.post(f"{server.url}/api/v1/optim_step", headers={"X-API-Key": KEY_A},
                     json={"model_id": tc.model_id, "seq_id": 2, "adam_params": {"learning_rate": 1e-3}}).json()
    r = httpx.post(f"{server.url}/api/v1/retrieve_future", json={"request_id": fut["request_id"]}, headers=h_b)
    assert r.status_code == 404
    r = httpx.post(f"{server.url}/api/v1/retrieve_future", json={"request_id": fut["request_id"]},
                   headers={"X-API-Key": KEY_A}, timeout=60)
    assert r.status_code == 200 and "metrics" in r.json()


def test_bad_requests_get_clear_errors_and_the_server_keeps_serving(server: Server) -> None:
    import tinker

    sc = _client(server)
    tc = sc.create_lora_training_client(base_model="tiny", rank=4).result()
    h = {"X-API-Key": KEY_A}
    r = httpx.post(f"{server.url}/api/v1/forward_backward", content=b"\x00not a protobuf\xff\xff",
                   headers={**h, "Content-Type": "application/x-protobuf"})
    assert r.status_code == 400 and "not a ForwardBackwardRequest" in r.json()["message"]
    r = httpx.post(f"{server.url}/api/v1/get_info", json={"model_id": tc.model_id},
                   headers={"X-API-Key": "tml-not-a-known-key"})
    assert r.status_code == 401 and r.json()["message"] == "unknown API key"
    r = httpx.post(f"{server.url}/api/v1/get_info", json={"model_id": "nope:train:9"}, headers=h)
    assert r.status_code == 404
    r = httpx.post(f"{server.url}/api/v1/optim_step", headers=h, json={"model_id": tc.model_id, "seq_id": 1,
                                                                       "adam_params": {"learning_rat": 1}})
    assert r.status_code == 400 and "OptimStepRequest" in r.json()["message"]
    with pytest.raises(tinker.BadRequestError, match="LoRA rank 64: this server holds ranks 1 to 16"):
        sc.create_lora_training_client(base_model="tiny", rank=64).result()
    with pytest.raises(tinker.BadRequestError, match="this server serves 'tiny' only"):
        sc.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=4).result()
    with pytest.raises(tinker.RequestFailedError, match="importance_sampling needs loss_fn_inputs\\['logprobs'\\]"):
        tc.forward_backward([_datum()], "importance_sampling").result()
    # the same server, another client: still serving
    other = sc.create_lora_training_client(base_model="tiny", rank=4).result()
    assert other.forward_backward([_datum()], "cross_entropy").result().metrics["loss:sum"] > 0


def test_seq_ids_out_of_order_retried_or_missing(server: Server) -> None:
    """Raw protobuf requests of one model: a chunk ahead of its turn waits for the one before it, a retried
    seq_id answers the first request's id and runs once, a gap that nothing fills fails the request behind it
    (category user) after --seq-gap-timeout, and the model goes on after it."""
    from tinker import types
    from tinker.proto.request_conv import forward_backward_request_to_proto

    tc = _client(server).create_lora_training_client(base_model="tiny", rank=4, seed=5).result()
    h = {"X-API-Key": KEY_A, "Content-Type": "application/x-protobuf"}

    def send(seq_id: int) -> str:
        req = types.ForwardBackwardRequest(model_id=tc.model_id, seq_id=seq_id, forward_backward_input=(
            types.ForwardBackwardInput(data=[_datum()], loss_fn="cross_entropy")))
        r = httpx.post(f"{server.url}/api/v1/forward_backward", headers=h,
                       content=forward_backward_request_to_proto(req).SerializeToString())
        assert r.status_code == 200, r.text
        return r.json()["request_id"]

    def result(rid: str) -> dict:
        r = httpx.post(f"{server.url}/api/v1/retrieve_future", json={"request_id": rid},
                       headers={"X-API-Key": KEY_A}, timeout=60)
        return r.json() if r.headers["content-type"].startswith("application/json") else {"proto": r.content}

    second, first = send(2), send(1)
    assert send(2) == second  # a retry
    assert "proto" in result(first) and "proto" in result(second)
    stranded = send(4)  # 3 never comes
    failed = result(stranded)
    while failed.get("type") == "try_again":
        failed = result(stranded)
    assert failed["category"] == "user" and "seq_id 3 never arrived" in failed["error"]
    assert "proto" in result(send(5))  # the model goes on


def test_many_samplers_share_the_slots_and_an_evicted_one_is_reloaded(server: Server) -> None:
    """Ten sampler checkpoints of one run, each after one more step, on an engine of two slots (eight adapters
    registered at most): each save is copied into the run's live adapter in place; every sampler reads its own
    weights, the older ones from their directories, the first one too after the least recently used were
    unloaded and it was loaded again."""
    from tinker import types

    sc = _client(server)
    tc = sc.create_lora_training_client(base_model="tiny", rank=8, seed=4).result()
    saved = []
    for i in range(10):
        _steps(tc, _datum(), "cross_entropy", 1)
        lps = tc.forward([_datum()], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
        saved.append((tc.save_weights_for_sampler(f"v{i}").result().path, lps))
    prompt = types.ModelInput.from_ints(TOKENS)
    for path, lps in [*saved, saved[0], saved[5]]:
        got = sc.create_sampling_client(model_path=path).result().compute_logprobs(prompt).result()
        np.testing.assert_allclose(np.array(got[1:], dtype=np.float32), lps, atol=2e-4, err_msg=path)
    assert np.abs(saved[0][1] - saved[-1][1]).max() > 0.05  # the versions differ: each sampler read its own
    # the engine ran since the sampling test: every save went into the live adapter's slot in place
    assert server.log.read_text().count("updated in place") >= 10


def test_clients_training_at_once_do_not_disturb_each_other(server: Server) -> None:
    """Three clients stepping in parallel threads lose exactly what each loses alone."""
    from concurrent.futures import ThreadPoolExecutor

    sc = _client(server)
    alone = _steps(sc.create_lora_training_client(base_model="tiny", rank=4, seed=7).result(), _datum(),
                   "cross_entropy", 3)
    clients = [sc.create_lora_training_client(base_model="tiny", rank=4, seed=7).result() for _ in range(3)]
    with ThreadPoolExecutor(3) as pool:
        runs = list(pool.map(lambda tc: _steps(tc, _datum(), "cross_entropy", 3), clients))
    assert runs == [alone] * 3


def test_bench_tinker_runs_clients_side_by_side(server: Server) -> None:
    """``agentrl bench tinker`` against this server: one phase per client count, every client's steps done,
    the last line one JSON object."""
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "bench", "tinker", "--url", server.url, "--api-key", KEY_A,
                        "--clients", "1,2", "--steps", "1", "--batch", "2", "--seq-len", "16", "--samples", "2",
                        "--max-tokens", "4"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(res["clients"]) == {"1", "2"} and res["clients"]["1"]["steps_per_s_over_one"] == 1.0
    for phase in res["clients"].values():
        assert phase["steps_per_s"] > 0 and phase["sampled_tokens_per_s"] > 0  # 2 samples of 4 tokens per step


def test_bench_tinker_direct_phase_runs_the_same_steps_on_agentrl_calls(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The bench's baseline: the same client steps on agentrl's own trainer and engine calls, every step's
    adapter copied into its engine slot in place (a publish per step and client, with the engine's time)."""
    import argparse
    import asyncio

    from agentrl.tools.bench.tinker_api import _batch
    from agentrl.tools.bench.tinker_direct import measure_direct, wire_batch

    args = argparse.Namespace(clients=[1, 2], steps=2, batch=2, seq_len=16, samples=2, max_tokens=4, rank=4,
                              max_rank=8, max_adapters=2, vocab=900, seed=0)
    res = asyncio.run(measure_direct(args, str(tiny_model_dir), tmp_path, wire_batch(_batch(args, args.vocab))))
    assert set(res["clients"]) == {"1", "2"}
    for phase in res["clients"].values():
        assert phase["steps_per_s"] > 0 and phase["sampled_tokens_per_s"] > 0
    assert res["publishes"] == (1 + 2) * args.steps  # every timed step of every client updated its slot in place
    assert 0 < res["publish_engine_ms_p50"] < 1000


def test_a_restart_continues_a_run_exactly(server: Server) -> None:
    """save_state, SIGKILL the server, start it again on the same --dir:
    create_training_client_from_state_with_optimizer takes the next step exactly as the uninterrupted run did."""
    sc = _client(server)
    tc = sc.create_lora_training_client(base_model="tiny", rank=8, seed=3).result()
    _steps(tc, _datum(), "cross_entropy", 2)
    path = tc.save_state("step-2").result().path
    uninterrupted = _steps(tc, _datum(), "cross_entropy", 2)
    server.kill()
    server.start()
    resumed = _client(server).create_training_client_from_state_with_optimizer(path).result()
    assert _steps(resumed, _datum(), "cross_entropy", 2) == uninterrupted


def test_the_rest_client_lists_runs_and_checkpoints_across_a_restart(server: Server) -> None:
    """The SDK's RestClient: a LoRA run created with user_metadata, one save_state and one sampler save; the run
    answers its metadata, rank and latest checkpoints by tinker path, lists both checkpoints, is not found for
    another key, and answers the same after the server was killed and started again on the same --dir; a deleted
    checkpoint is gone."""
    import tinker

    sc = _client(server)
    tc = sc.create_lora_training_client(base_model="tiny", rank=4, seed=8,
                                        user_metadata={"renderer_name": "role_colon"}).result()
    state = tc.save_state("rest-state").result().path
    sampler = tc.save_weights_for_sampler("rest-sampler").result().path

    def check(rest) -> None:
        run = rest.get_training_run_by_tinker_path(state).result()
        assert run.training_run_id == tc.model_id and run.base_model == "tiny" and run.is_lora
        assert run.user_metadata == {"renderer_name": "role_colon"} and run.lora_rank == 4
        assert run.model_owner and KEY_A not in run.model_owner
        assert run.last_checkpoint is not None and run.last_checkpoint.tinker_path == state
        assert run.last_sampler_checkpoint is not None and run.last_sampler_checkpoint.tinker_path == sampler
        listed = rest.list_checkpoints(tc.model_id).result().checkpoints
        assert {(c.checkpoint_type, c.tinker_path) for c in listed} == {("training", state), ("sampler", sampler)}
        assert all(c.size_bytes and c.size_bytes > 0 for c in listed)
        runs = rest.list_training_runs(limit=100).result()
        assert tc.model_id in {r.training_run_id for r in runs.training_runs}
        assert runs.cursor.total_count >= len(runs.training_runs)
        mine = rest.list_user_checkpoints(limit=100).result().checkpoints
        assert {state, sampler} <= {c.tinker_path for c in mine}
        other = _client(server, KEY_B).create_rest_client()
        with pytest.raises(tinker.NotFoundError):
            other.get_training_run(tc.model_id).result()
        with pytest.raises(tinker.NotFoundError):
            other.list_checkpoints(tc.model_id).result()
        with pytest.raises(tinker.NotFoundError):
            other.delete_checkpoint_from_tinker_path(state).result()
        assert tc.model_id not in {r.training_run_id for r in other.list_training_runs(limit=100).result().training_runs}

    check(sc.create_rest_client())
    server.kill()
    server.start()
    rest = _client(server).create_rest_client()
    check(rest)
    rest.delete_checkpoint_from_tinker_path(sampler).result()
    assert [c.tinker_path for c in rest.list_checkpoints(tc.model_id).result().checkpoints] == [state]
    assert rest.get_training_run(tc.model_id).result().last_sampler_checkpoint is None
