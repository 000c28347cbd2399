"""The inference client and server against a real vLLM server (tiny random model, one server per session)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from agentrl.inference import (
    ContextLengthError,
    InferenceClient,
    InferenceError,
    ServerStartError,
    VLLMServer,
    VLLMServerConfig,
    reap_stale,
)
from tests.conftest import require
from tests.integration.vllm_metrics import start_paused_mid_generation

pytestmark = pytest.mark.integration

PROMPT = [311, 279, 304, 223, 20]
DEFAULT_VERSION = "default"  # vLLM's weight version label until /update_weight_version
LONG_PROMPT = [(i * 11) % 390 + 5 for i in range(300)]  # > a few KV blocks: exercises the prefix cache


def _make_adapter(base: Path, out: Path, seed: int) -> Path:
    """A peft LoRA (r=8 on q_proj/v_proj) with random, non-zero B matrices, so it changes the model."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                           LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return _make_adapter(tiny_model_dir, root / "a", 1), _make_adapter(tiny_model_dir, root / "b", 2)


def _differs(x, y) -> bool:
    return x.token_ids != y.token_ids or max(abs(a - b) for a, b in zip(x.logprobs, y.logprobs, strict=True)) > 1e-3


def test_only_the_api_server_listens_on_the_engines_port(vllm_server) -> None:
    """The engine core (forked from the API server on the CPU build) holds no copy of the listening socket:
    one would keep the port taken after the API server died, and a restart on it failed."""
    from agentrl.core.utils.procs import listens_on, process_table

    group = [pid for pid, (_, pgid, _) in process_table().items() if pgid == vllm_server.pgid]
    assert len(group) >= 2, group  # the API server and its engine core
    assert [pid for pid in group if listens_on(pid, vllm_server.port)] == [vllm_server.proc.pid]


async def test_generate_tokens_logprobs_versions(vllm_server) -> None:
    async with InferenceClient([vllm_server.url]) as c:
        assert c.pool.endpoints[0].mode is None
        # ignore_eos: the lengths below are asserted, and at temperature 1 the model may sample its end token first
        g = await c.generate(PROMPT, max_tokens=8, temperature=1.0, ignore_eos=True)
        assert c.pool.endpoints[0].mode == "generate"  # token-in/token-out route is served
        assert len(g.token_ids) == len(g.logprobs) == 8 and g.finish_reason == "length"
        assert all(isinstance(t, int) for t in g.token_ids) and all(lp <= 0.0 for lp in g.logprobs)
        assert g.weight_versions is not None and len(g.weight_versions) == 1
        assert g.weight_versions[0][1:] == (0, 8) and g.endpoint == vllm_server.url
        g1, g2 = [await c.generate(PROMPT, max_tokens=8, temperature=0.0) for _ in range(2)]
        assert g1.token_ids == g2.token_ids and g1.logprobs == pytest.approx(g2.logprobs, abs=1e-4)
        try:
            await c.set_weight_version("42")
            assert (await c.generate(PROMPT, max_tokens=3, ignore_eos=True)).weight_versions == [("42", 0, 3)]
        finally:
            await c.set_weight_version(DEFAULT_VERSION)  # the server is shared by the whole session
        assert await c.health() == {vllm_server.url: True}


async def test_stop_token_and_eos_are_in_the_output(vllm_server, tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(tiny_model_dir).eos_token_id
    async with InferenceClient([vllm_server.url]) as c:
        ref = await c.generate(PROMPT, max_tokens=8, temperature=0.0)
        stop = ref.token_ids[3]
        g = await c.generate(PROMPT, max_tokens=8, temperature=0.0, stop_token_ids=[stop])
        cut = ref.token_ids.index(stop) + 1
        assert g.token_ids == ref.token_ids[:cut] and g.finish_reason == "stop" and len(g.logprobs) == cut
        # A random model emits EOS now and then; at a high temperature some of these samples end on it.
        gens = await asyncio.gather(*(c.generate(PROMPT, max_tokens=300, temperature=2.0, seed=s) for s in range(24)))
        stopped = [x for x in gens if x.finish_reason == "stop"]
        assert stopped, "no sample ended on EOS"
        for x in stopped:
            assert x.token_ids[-1] == eos and eos not in x.token_ids[:-1] and len(x.logprobs) == len(x.token_ids)


async def test_context_length_error(vllm_server) -> None:
    async with InferenceClient([vllm_server.url]) as c:
        with pytest.raises(ContextLengthError, match="maximum model length"):
            await c.generate([5] * 1100, max_tokens=4)
        with pytest.raises(InferenceError, match="does not exist") as ei:
            await c.generate(PROMPT, max_tokens=4, model="no-such-adapter")
        assert ei.value.status_code == 404


async def test_lora_adapter_changes_outputs_and_reloads_inplace(vllm_server, adapters) -> None:
    a, b = adapters
    async with InferenceClient([vllm_server.url]) as c:
        base = await c.generate(PROMPT, max_tokens=12, temperature=0.0)
        assert await c.load_lora_adapter("policy", str(a)) < 5.0
        ga = await c.generate(PROMPT, max_tokens=12, temperature=0.0, model="policy")
        assert _differs(ga, base)
        await c.load_lora_adapter("policy", str(b), inplace=True)  # the RL sync: same name, new weights
        gb = await c.generate(PROMPT, max_tokens=12, temperature=0.0, model="policy")
        assert _differs(gb, ga) and _differs(gb, base)
        await c.load_lora_adapter("ref_b", str(b), inplace=False)
        ref = await c.generate(PROMPT, max_tokens=12, temperature=0.0, model="ref_b")
        assert ref.token_ids == gb.token_ids and ref.logprobs == pytest.approx(gb.logprobs, abs=1e-3)
        again = await c.generate(PROMPT, max_tokens=12, temperature=0.0)
        assert again.token_ids == base.token_ids  # the base model is untouched
        await c.unload_lora_adapter("ref_b")
        with pytest.raises(InferenceError, match="does not exist"):
            await c.generate(PROMPT, max_tokens=2, model="ref_b")


async def test_same_path_reload_with_prefix_cache_reset(vllm_server, adapters, tmp_path: Path) -> None:
    """vLLM keys cached prefixes on (adapter name, path): after rewriting the files at one path and reloading
    in place, ``reset_prefix_cache`` makes the new weights see long prompts correctly."""
    a, b = adapters
    same = tmp_path / "same"
    shutil.copytree(a, same)
    async with InferenceClient([vllm_server.url]) as c:
        await c.load_lora_adapter("ref_b2", str(b))
        want = await c.generate(LONG_PROMPT, max_tokens=8, temperature=0.0, model="ref_b2")
        await c.load_lora_adapter("same", str(same))
        await c.generate(LONG_PROMPT, max_tokens=8, temperature=0.0, model="same")  # caches A's KV
        shutil.copytree(b, same, dirs_exist_ok=True)
        await c.load_lora_adapter("same", str(same), inplace=True)
        await c.reset_prefix_cache()
        got = await c.generate(LONG_PROMPT, max_tokens=8, temperature=0.0, model="same")
        assert got.token_ids == want.token_ids
        for name in ("ref_b2", "same"):
            await c.unload_lora_adapter(name)


async def _interrupted(c: InferenceClient, url: str, action, n: int = 900):
    """Run a long greedy generation (``ignore_eos``: the embedded model may stop early), freeze the engine
    once it has produced a few tokens (read from its counter, not guessed from a delay: a fast engine
    finishes before a fixed delay, a busy one has not started), apply ``action`` and resume."""
    try:
        task = await start_paused_mid_generation(
            c, url, lambda: c.generate(PROMPT[:2], max_tokens=n, temperature=0.0, ignore_eos=True), first=8, total=n)
        await action()
    finally:
        await c.resume()
    return await task


async def test_pause_keep_and_weight_version_spans(vllm_server) -> None:
    async with InferenceClient([vllm_server.url]) as c:
        await c.set_weight_version("10")

        try:
            g = await _interrupted(c, vllm_server.url, lambda: c.set_weight_version("11"))
        finally:
            await c.set_weight_version(DEFAULT_VERSION)
        spans = g.weight_versions
        assert [v for v, _, _ in spans] == ["10", "11"] and g.finish_reason == "length"
        assert spans[0][1] == 0 and spans[0][2] == spans[1][1] and spans[-1][2] == len(g.token_ids) == 900


async def test_pause_abort_returns_partial_generation(vllm_server) -> None:
    async with InferenceClient([vllm_server.url]) as c:
        g = await _interrupted(c, vllm_server.url, lambda: c.pause("abort"))
        assert g.finish_reason == "abort" and len(g.token_ids) == len(g.logprobs) < 900
        assert (await c.generate(PROMPT, max_tokens=2)).finish_reason == "length"


async def test_unreachable_endpoint_fails_within_retry_budget() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with InferenceClient([f"http://127.0.0.1:{port}"], timeout_s=1, max_retries=2, backoff_s=0.05) as c:
        t0 = time.monotonic()
        with pytest.raises(InferenceError, match=f"after 3 attempts.*127.0.0.1:{port}"):
            await c.generate(PROMPT, max_tokens=4)
        assert time.monotonic() - t0 < 5.0
        assert await c.health() == {f"http://127.0.0.1:{port}": False}


def test_bad_model_dir_is_a_clear_error(tmp_path: Path, tiny_model_dir: Path) -> None:
    bad = tmp_path / "no-tokenizer"
    bad.mkdir()
    shutil.copy(tiny_model_dir / "config.json", bad / "config.json")
    with pytest.raises(ValueError, match=r"has no tokenizer \(tokenizer.json / tokenizer_config.json\)"):
        VLLMServer(VLLMServerConfig(model=str(bad)), tmp_path).start()
    with pytest.raises(ValueError, match=r"has no config\.json"):
        VLLMServer(VLLMServerConfig(model=str(tmp_path)), tmp_path).start()
    with pytest.raises(ValueError, match="does not exist"):
        VLLMServer(VLLMServerConfig(model=str(tmp_path / "missing")), tmp_path).start()


def test_start_failure_shows_log_tail(tiny_model_dir: Path, tmp_path: Path) -> None:
    require(importlib.util.find_spec("vllm") is not None, "vLLM is not installed")
    cfg = VLLMServerConfig(model=str(tiny_model_dir), extra_args=["--max-model-len", "not-a-number"],
                           startup_timeout_s=120)
    server = VLLMServer(cfg, tmp_path)
    t0 = time.monotonic()
    with pytest.raises(ServerStartError, match="exited with code") as ei:
        server.start()
    assert time.monotonic() - t0 < 60
    assert "not-a-number" in str(ei.value) and str(server.log_path) in str(ei.value)
    assert not server.is_running() and not list(tmp_path.glob("vllm-*.pid"))


def _orphan(seconds: int) -> tuple[int, int]:
    """Start ``sleep seconds`` in a new session whose leader exits at once (like a crashed server's
    engine processes): returns (pid, pgid). The orphan is reparented, so it is not our child."""
    out = subprocess.run(["bash", "-c", f"sleep {seconds} >/dev/null 2>&1 & echo $! $$"], capture_output=True,
                         text=True, check=True, start_new_session=True, timeout=10).stdout.split()
    pid, pgid = int(out[0]), int(out[1])
    # bash reports the child's pid right after fork; until the child has exec'd, its command line is still
    # bash's, and reap_stale rightly takes a mismatched command for a recycled pid. Wait for the exec.
    want = f"sleep\0{seconds}\0".encode()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/cmdline").read_bytes() != want:
        assert time.monotonic() < deadline, f"sleep {seconds} (pid {pid}) never started"
        time.sleep(0.01)
    return pid, pgid


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_reap_stale_kills_only_matching_groups(tmp_path: Path) -> None:
    stale, stale_pgid = _orphan(60)
    other, other_pgid = _orphan(61)
    live = -1
    try:
        (tmp_path / "vllm-1.pid").write_text(json.dumps({"pid": stale, "pgid": stale_pgid, "cmd": ["sleep", "60"]}))
        # A recycled pid: the recorded command does not match what runs under that pid now.
        (tmp_path / "vllm-2.pid").write_text(json.dumps({"pid": other, "pgid": other_pgid,
                                                         "cmd": ["python", "-m", "vllm"]}))
        # A server whose driver (here: this process) is alive belongs to a live run: never reaped.
        me_start = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()[19]
        live, live_pgid = _orphan(62)
        (tmp_path / "vllm-3.pid").write_text(json.dumps({"pid": live, "pgid": live_pgid, "cmd": ["sleep", "62"],
                                                         "owner": os.getpid(), "owner_start": me_start}))
        assert reap_stale(tmp_path, timeout_s=5) == [stale]
        assert not _alive(stale) and _alive(other) and _alive(live)
        assert [p.name for p in tmp_path.glob("vllm-*.pid")] == ["vllm-3.pid"]
    finally:
        for pid in (stale, other, live):
            if pid > 0 and _alive(pid):
                os.kill(pid, signal.SIGKILL)
