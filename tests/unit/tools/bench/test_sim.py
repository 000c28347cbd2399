"""The sync/async pipeline simulator: determinism, sync invariants, staleness bound, limiting cases."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from agentrl.config.run import PipelineConfig
from agentrl.tools.bench.pipeline import elastic_split, main, run_pipeline_bench
from agentrl.tools.bench.sim import PipelineSim, SimParams
from agentrl.tools.bench.traces import make_trace

SMALL = SimParams(slots=16, decode_half_n=8.0)
B, G = 4, 4


def bench(mix: str = "math", eta: int = 1, seed: int = 0, **kw) -> dict:
    return run_pipeline_bench(mix, kw.pop("steps", 6), eta, seed, groups_per_step=B, group_size=G,
                              params=kw.pop("params", SMALL), **kw)


def test_trace_is_deterministic_and_prefix_stable() -> None:
    a, b = make_trace("tool", 3, B, G, seed=7), make_trace("tool", 5, B, G, seed=7)
    assert a.steps == b.steps[:3]
    assert a.steps != make_trace("tool", 3, B, G, seed=8).steps
    assert all(len(g) == G for g in b.groups) and len(b.groups) == 5 * B
    ep = a.groups[0][0]
    assert ep.turns[-1].tool_latency_s == 0.0 and ep.total_tokens > ep.output_tokens > 0


def test_trace_lengths_drift_upward() -> None:
    tr = make_trace("math", 40, 8, 8, seed=1)
    first = sum(e.output_tokens for g in tr.steps[0] + tr.steps[1] for e in g)
    last = sum(e.output_tokens for g in tr.steps[-1] + tr.steps[-2] for e in g)
    assert last > 1.5 * first


def test_same_seed_same_result() -> None:
    r1, r2 = bench("tool", seed=3), bench("tool", seed=3)
    assert json.dumps(r1, sort_keys=True) == json.dumps(r2, sort_keys=True)
    assert bench("tool", seed=4)["sync"]["total_s"] != r1["sync"]["total_s"]


def test_sync_invariants() -> None:
    trace = make_trace("tool", 5, B, G, seed=0)
    res = PipelineSim(trace, SMALL, "sync", 5).run()
    assert res.steps == 5 and res.trained_groups == 5 * B
    assert dict(res.staleness_hist) == {0: 5 * B}
    assert res.trained_tokens == sum(e.total_tokens for g in trace.groups for e in g)
    train_s = sum(b - a for a, b in res.train_iv)
    assert train_s == pytest.approx(res.train_s)
    r = bench("tool", steps=5)
    assert r["trainer_idle_sync"] == pytest.approx(1 - train_s / res.total_s)
    # no overlap: the engine is empty whenever the trainer works
    for a, b in res.train_iv:
        assert all(u == 0 for t, u in res.slots_timeline if a < t < b)


def test_async_eta0_replays_sync_exactly() -> None:
    r = bench("tool", eta=0)
    assert r["async_over_sync"] == pytest.approx(1.0)
    assert r["async"]["total_s"] == pytest.approx(r["sync"]["total_s"])
    assert r["max_staleness_seen"] == 0 and r["dropped_groups"] == 0


@pytest.mark.parametrize("policy", ["drop_stale", "block"])
@pytest.mark.parametrize("eta", [1, 2, 3])
def test_async_respects_eta(eta: int, policy: str) -> None:
    r = bench("math", eta=eta, drop_policy=policy, steps=8)
    assert r["max_staleness_seen"] <= eta
    assert max(int(k) for k in r["staleness_hist"]) <= eta
    assert r["async"]["trained_groups"] == 8 * B
    assert r["async_over_sync"] > 1.0
    if policy == "block":
        assert r["dropped_groups"] == 0


def test_weight_updates_split_in_flight_turns() -> None:
    """Partial rollouts: with overlap some trained groups hold tokens of more than one version."""
    trace = make_trace("math", 12, B, G, seed=0)
    sim = PipelineSim(trace, SMALL, "async", 5, PipelineConfig(max_staleness=2, capacity_groups=4 * B,
                                                                drop_policy="drop_stale"))
    sim.run()
    mixed = [ep for _, _, ep in sim.decoding if len(ep.tokens_by_version) > 1]
    mixed += [ep for _, _, g in sim.core.queue for ep in g.members if len(ep.tokens_by_version) > 1]
    assert mixed, "expected in-flight episodes spanning a weight update"
    for ep in mixed:
        assert sum(ep.tokens_by_version.values()) <= ep.episode.turns[0].output_tokens + 1e-6


def test_dropped_token_frac_counts_the_decode_work_of_dropped_groups() -> None:
    trace = make_trace("tool", 20, B, G, seed=0)
    sim = PipelineSim(trace, SMALL, "async", 8, PipelineConfig(max_staleness=1, capacity_groups=4 * B,
                                                                drop_policy="drop_stale"))
    dropped = []
    count = sim.core.on_drop
    sim.core.on_drop = lambda g: (dropped.append(g), count(g))
    res = sim.run()
    assert dropped and res.buffer["dropped_stale"] == len(dropped)
    # a dropped group had finished: its generated tokens are exactly its episodes' output tokens
    assert res.dropped_output_tokens == pytest.approx(sum(m.episode.output_tokens for g in dropped
                                                          for m in g.members))
    assert res.trained_output_tokens + res.dropped_output_tokens <= res.decoded_tokens * (1 + 1e-9)
    r = bench("tool", eta=1, drop_policy="block", steps=8)
    assert r["dropped_groups"] == 0 and r["dropped_token_frac"] == 0.0


def test_instant_trainer_makes_async_generation_bound() -> None:
    fast = replace(SMALL, train_s_per_token=0.0, train_step_s=0.0, sync_s=0.0)
    r = bench("math", eta=50, params=fast, capacity_groups=12 * B, steps=8)
    assert r["trainer_idle_async"] > 0.999
    assert r["inference_idle_async"] < 0.1 < r["inference_idle_sync"]
    # generation-bound: no faster than decoding every generated token at the engine's peak rate
    peak_tok_s = SMALL.slots * SMALL.decode_rate(SMALL.slots)
    assert r["async"]["total_s"] >= r["async"]["decoded_tokens"] / peak_tok_s * 0.999
    assert r["async"]["total_s"] <= r["async"]["decoded_tokens"] / peak_tok_s * 1.3


def test_slow_trainer_idles_only_for_the_first_batch_in_async() -> None:
    slow = replace(SMALL, train_step_s=1e5)
    r = bench("math", eta=1, params=slow, steps=6)
    assert r["trainer_idle_async"] < r["trainer_idle_sync"] / 4  # sync waits for generation every step
    assert r["async_over_sync"] > 1.0


def test_cli_prints_json_last_and_writes_plot(tmp_path, capsys) -> None:
    main(["--mix", "math", "--steps", "3", "--eta", "1", "--groups-per-step", "2", "--group-size", "2",
          "--gpus", "1:1", "--out", str(tmp_path)])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    out = json.loads(last)
    for key in ("async_over_sync", "trainer_idle_sync", "trainer_idle_async", "max_staleness_seen",
                "eta", "mix", "seed", "dropped_token_frac"):
        assert key in out
    assert list(tmp_path.glob("*.png"))


def test_weight_sync_pauses_decoding() -> None:
    """Decode stops while weights are published: all decoding happens outside the sync windows."""
    slow_sync = replace(SMALL, train_s_per_token=0.0, train_step_s=0.0, sync_s=1e4)
    r = bench("math", eta=2, params=slow_sync, steps=4)
    peak_tok_s = SMALL.slots * SMALL.decode_rate(SMALL.slots)
    assert r["async"]["total_s"] >= 4 * 1e4 + r["async"]["decoded_tokens"] / peak_tok_s


def test_elastic_split_follows_the_bottleneck() -> None:
    """The probe gives GPUs to whichever side limits throughput: slow decode → inference, fast → trainer."""
    kw = dict(groups_per_step=2, group_size=2, probe_steps=2, request_overhead_s=0.0)
    slow_decode, rates = elastic_split("math", 4, 1, 0, decode_tok_s=0.5, **kw)
    assert slow_decode == 3 and set(rates) == {1, 2, 3}
    assert rates[3] > rates[2] > rates[1]
    fast_decode, _ = elastic_split("math", 4, 1, 0, decode_tok_s=1e7, prefill_tok_s=1e9, **kw)
    assert fast_decode == 1


def test_elastic_split_probes_with_the_runs_buffer_rules() -> None:
    """The split probe replays the buffer rules of the run it chooses for: with ``newest``, the long groups
    that ``oldest`` drops are trained, so every split's probed throughput is higher."""
    kw = dict(groups_per_step=8, group_size=4, probe_steps=6, drop_policy="drop_stale")
    _, oldest = elastic_split("tool", 4, 1, 0, **kw)
    _, newest = elastic_split("tool", 4, 1, 0, staleness_from="newest", **kw)
    assert set(oldest) == set(newest) == {1, 2, 3}
    assert all(newest[n] > oldest[n] for n in oldest)


def test_cli_auto_split_reports_the_split(capsys) -> None:
    main(["--mix", "math", "--steps", "2", "--groups-per-step", "2", "--group-size", "2", "--gpus", "auto:3"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["gpus"] in ("1:2", "2:1") and set(out["split_probe_tokens_per_s"]) == {"1", "2"}


def test_staleness_from_newest_keeps_long_groups_and_reports_their_old_tokens() -> None:
    """pipeline.staleness_from = "newest": a group still generating within η is trained, not dropped; the
    tokens it carries from older versions are counted past η (what importance correction must absorb)."""
    oldest = bench("tool", eta=1, drop_policy="drop_stale", steps=8)
    newest = bench("tool", eta=1, drop_policy="drop_stale", steps=8, staleness_from="newest")
    assert oldest["dropped_groups"] > 0 and oldest["tokens_beyond_eta_frac"] == 0.0
    assert max(int(k) for k in oldest["trained_token_staleness"]) <= 1
    assert newest["dropped_groups"] < oldest["dropped_groups"]
    assert newest["dropped_token_frac"] < oldest["dropped_token_frac"]
    assert newest["tokens_beyond_eta_frac"] > 0.0
    assert newest["tokens_beyond_eta_frac"] == pytest.approx(
        sum(v for k, v in newest["trained_token_staleness"].items() if int(k) > 1), abs=1e-3)
    assert sum(newest["trained_token_staleness"].values()) == pytest.approx(1.0, abs=1e-3)


def test_engines_split_the_slots_and_keep_an_episode_on_one_engine() -> None:
    """N engines: the client's dispatch rule (``EndpointPool``) places each episode's first turn, its later
    turns stay there, no engine holds more than its share of slots, and every request is accounted back."""
    trace = make_trace("tool", 6, B, G, seed=0)
    p = replace(SMALL, engines=4)
    seen: dict[object, set[int]] = {}  # keyed by the episode itself (kept alive, so never confused with a later one)
    sim = PipelineSim(trace, p, "sync", 4)
    request = sim._request

    def spy(ep) -> None:
        request(ep)
        seen.setdefault(ep, set()).add(sim.engines.index(ep.engine))
        assert all(e.used <= e.slots == 4 for e in sim.engines)

    sim._request = spy
    res = sim.run()
    assert res.steps == 4 and all(len(s) == 1 for s in seen.values())
    assert len({e for s in seen.values() for e in s}) == 4  # every engine got episodes
    assert all(e.endpoint.outstanding == 0 and e.endpoint.outstanding_tokens == 0 for e in sim.engines)
    assert res.trained_tokens == PipelineSim(trace, SMALL, "sync", 4).run().trained_tokens


@pytest.mark.parametrize("dispatch", ["tokens", "requests"])
def test_one_engine_is_the_pooled_model_whatever_the_dispatch_rule(dispatch: str) -> None:
    """engines=1 is the pooled engine (the rule has nothing to choose); over several engines the same
    batches are trained and the JSON says which engines and rule produced the figures."""
    pooled = bench("swe", steps=4)
    assert bench("swe", steps=4, dispatch=dispatch)["sync"] == pooled["sync"]
    split = bench("swe", steps=4, dispatch=dispatch, params=replace(SMALL, engines=4))
    assert split["engines"] == 4 and split["dispatch"] == dispatch
    assert split["sync"]["trained_tokens"] == pooled["sync"]["trained_tokens"]
    assert split["sync"]["total_s"] != pooled["sync"]["total_s"]  # the split is modelled, not ignored


def test_slots_must_split_evenly_over_engines() -> None:
    with pytest.raises(ValueError, match="split evenly"):
        PipelineSim(make_trace("tool", 2, B, G), replace(SMALL, engines=3), "sync", 1)


def test_kv_cache_bounds_what_runs_at_once() -> None:
    """A bounded KV cache: the requests running on an engine never hold more than it (one alone may, so a
    long context still runs), everything is released at the end, and a smaller cache only slows sync."""
    trace = make_trace("swe", 4, B, G, seed=0)
    biggest = max(sum(t.prompt_tokens + t.output_tokens for t in e.turns) for g in trace.groups for e in g)
    p = replace(SMALL, engines=2, kv_tokens=2 * biggest)
    sim = PipelineSim(trace, p, "sync", 3)
    schedule, cache_bound = sim._schedule, []

    def spy(eng) -> None:
        schedule(eng)
        assert eng.kv_used <= eng.kv_tokens or eng.used == 1
        cache_bound.append(bool(eng.waiting) and eng.used < eng.slots)  # a request waits for the cache, not a slot

    sim._schedule = spy
    tight = sim.run()
    assert all(e.kv_used == 0 and e.used == 0 for e in sim.engines)
    assert any(cache_bound)
    roomy = PipelineSim(trace, replace(p, kv_tokens=0), "sync", 3).run()
    assert tight.trained_tokens == roomy.trained_tokens and tight.total_s > roomy.total_s


def test_cli_engines_dispatch_and_kv_cache(capsys) -> None:
    argv = ["--mix", "swe", "--steps", "2", "--groups-per-step", "2", "--group-size", "2", "--gpus", "2:1"]
    main([*argv, "--engines", "2", "--dispatch", "tokens", "--kv-tokens-per-gpu", "20000"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["engines"] == 2 and out["dispatch"] == "tokens"
    main(argv)
    pooled = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert pooled["engines"] == 1 and pooled["dispatch"] == "requests"


def test_the_bench_runs_what_an_async_run_runs_unless_told_otherwise() -> None:
    """No buffer flag: the async replay uses the pipeline settings ``agentrl train --mode async`` resolves to,
    and names them."""
    from agentrl.config.run import RunConfig

    run = RunConfig(mode="async", tasks_per_step=B).pipeline
    r = bench("tool", eta=None, steps=4)
    assert (r["eta"], r["drop_policy"], r["staleness_from"], r["max_token_age"], r["capacity_groups"]) == (
        run.max_staleness, run.drop_policy, run.staleness_from, run.token_age_cap(), run.capacity(B))
    assert r["drop_policy"] == "accept" and r["dropped_groups"] == 0
    told = bench("tool", eta=1, drop_policy="block", max_token_age=9, steps=4)
    assert (told["eta"], told["drop_policy"], told["max_token_age"]) == (1, "block", 9)


def test_tokens_past_the_cap_count_as_dropped_work() -> None:
    """The same replay with a tighter token-age cap: fewer trained tokens, the difference counted as capped."""
    loose = bench("tool", eta=2, max_token_age=20, steps=8)
    tight = bench("tool", eta=2, max_token_age=0, steps=8)
    assert loose["age_capped_token_frac"] == 0 < tight["age_capped_token_frac"] == tight["dropped_token_frac"]
    assert tight["async"]["trained_tokens"] < loose["async"]["trained_tokens"]
