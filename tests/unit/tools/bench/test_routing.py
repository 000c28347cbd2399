"""``agentrl bench routing``'s figures: engine vs trainer logprobs over loss-masked tokens, routing coverage,
version spans, the targets, and the in-process scorer's replay on/off passes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agentrl.core.types import Routing, StopReason, TrainSample, Trajectory
from agentrl.tools.bench.routing import (
    episode_figures,
    is_weight_std,
    metric_total,
    mixed_version,
    position_versions,
    scored_positions,
    split_turns,
    targets_met,
    token_figures,
)


def routing(n: int, spans: list[tuple[int, int]] | None = None) -> Routing:
    r = Routing(layers=2, top_k=2)
    versions = [0] * n
    for start, v in spans or []:
        versions[start:] = [v] * (n - start)
    r.extend((np.arange(n * 4).reshape(n, 2, 2) % 8).astype("uint8"), versions)
    return r


def sample(mask: list[int], behav: list[float], versions: list[int], r: Routing | None,
           ids: list[int] | None = None) -> TrainSample:
    return TrainSample(input_ids=ids or list(range(1, len(mask) + 1)), loss_mask=mask, behav_logprobs=behav, advantage=0.0,
                       versions=versions, routing=r)


def test_position_versions_unrolls_the_spans() -> None:
    assert position_versions(routing(5, [(3, 1)])) == [0, 0, 0, 1, 1]
    assert position_versions(routing(3)) == [0, 0, 0]
    assert position_versions(Routing(layers=2, top_k=2)) == []
    late = Routing(layers=1, top_k=1, ids=bytes(4), versions=[(2, 1)])
    assert position_versions(late) == [-1, -1, 1, 1]


def test_token_figures_over_masked_tokens() -> None:
    """MAE and IS-weight spread per pass, over loss-masked tokens only; a token counts as captured when
    the position before it has routing."""
    s = sample([0, 0, 1, 1, 0, 1], [0.0, 0.0, -1.0, -2.0, 0.0, -0.5], [-1, -1, 0, 0, -1, 1], routing(4))
    on = [9.0, 9.0, -1.0, -2.0, 9.0, -0.5]  # the masked tokens agree exactly; the rest is ignored
    off = [0.0, 0.0, -1.1, -1.8, 0.0, -0.5]
    fig = token_figures([s], [on], [off])
    assert fig["tokens"] == 3
    assert fig["logprob_mae_replay"] == 0.0 and fig["is_weight_std_replay"] == 0.0
    assert fig["logprob_mae_no_replay"] == pytest.approx(0.3 / 3)
    w = [math.exp(-0.1), math.exp(0.2), 1.0]
    mean = sum(w) / 3
    assert fig["is_weight_std_no_replay"] == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in w) / 3))
    assert fig["routing_captured_frac"] == pytest.approx(2 / 3)  # position 5's predecessor (4) is past n = 4

    v1 = token_figures([s], [on], [off], version=1)
    assert v1["tokens"] == 1 and v1["routing_captured_frac"] == 0.0 and v1["logprob_mae_no_replay"] == 0.0
    assert scored_positions(s) == [2, 3, 5] and scored_positions(s, 0) == [2, 3]


def test_token_figures_without_routing_or_tokens() -> None:
    s = sample([0, 1], [0.0, -1.0], [-1, 0], None)
    assert token_figures([s], [[0.0, -1.0]], [[0.0, -1.0]])["routing_captured_frac"] == 0.0
    empty = token_figures([s], [[0.0, -1.0]], [[0.0, -1.0]], version=1)
    assert empty["tokens"] == 0 and empty["logprob_mae_replay"] is None
    assert not targets_met({**empty, "routing_mismatch_frac": None})


def test_is_weight_std() -> None:
    assert is_weight_std([0.3, 0.3]) == pytest.approx(0.0, abs=1e-15)
    assert is_weight_std([0.0, math.log(3.0)]) == pytest.approx(1.0)


def test_targets() -> None:
    good = {"tokens": 10, "logprob_mae_replay": 1e-7, "logprob_mae_no_replay": 1e-3, "is_weight_std_replay": 1e-7,
            "is_weight_std_no_replay": 1e-3, "routing_mismatch_frac": 0.1, "routing_captured_frac": 1.0}
    assert targets_met(good)
    assert targets_met({**good, "logprob_mae_no_replay": 1e-7 * (1 - 1e-12)})  # a float32 tie
    assert not targets_met({**good, "logprob_mae_replay": 2e-3})
    assert not targets_met({**good, "is_weight_std_replay": 2e-3})
    assert not targets_met({**good, "routing_captured_frac": 0.99})


def test_episode_figures_and_mixed_versions() -> None:
    def traj(turns: int, stop: StopReason = StopReason.COMPLETED, r: Routing | None = None) -> Trajectory:
        return Trajectory(task_id="t", env="calc", num_turns=turns, stop_reason=stop, routing=r)

    trajs = [traj(2, r=routing(4, [(2, 1)])), traj(4, r=routing(3)), traj(0, StopReason.INFERENCE_ERROR)]
    assert episode_figures(trajs) == {"episodes": 3, "failed_episodes": 1, "mean_turns": 2.0}
    assert [mixed_version(t) for t in trajs] == [True, False, False]
    assert episode_figures([]) == {"episodes": 0, "failed_episodes": 0, "mean_turns": 0.0}


def test_split_turns_counts_generations_the_update_landed_in() -> None:
    t = Trajectory(task_id="t", env="calc", completion_ids=list(range(9)), loss_mask=[1, 1, 0, 1, 1, 0, 1, 1, 1],
                   logprobs=[0.0] * 9, versions=[0, 0, -1, 0, 1, -1, 1, 1, 1])
    assert split_turns(t) == 1
    assert split_turns(t.model_copy(update={"versions": [0, 1, -1, 0, 1, -1, 0, 0, 1]})) == 3
    assert split_turns(Trajectory(task_id="t", env="calc")) == 0


def test_scorer_replay_on_and_off() -> None:
    """Replaying the model's own routing changes nothing and counts no mismatch; other experts change the
    logprobs and are counted, on the positions of the asked version only."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from agentrl.moe import moe_info
    from agentrl.moe.replay import find_routers
    from agentrl.tools.bench.routing import Scorer

    config = AutoConfig.for_model("qwen3_moe", vocab_size=64, hidden_size=32, intermediate_size=48,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_hidden_layers=2,
                                  num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                                  norm_topk_prob=True, max_position_embeddings=64)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    info = moe_info(config)
    n = 6
    ids = list(range(3, 3 + n))
    own = {}
    hooks = [r.register_forward_hook(lambda m, a, out, i=i: own.__setitem__(i, out[2].clone()))
             for i, r in find_routers(model).items()]
    with torch.no_grad():
        plain = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    for h in hooks:
        h.remove()
    rows = torch.stack([own[0], own[1]], 1)[: n - 1].numpy().astype("uint8")  # [n - 1, layers, top_k]

    def sample_with(rows: np.ndarray, versions: list[int]) -> TrainSample:
        r = Routing(layers=2, top_k=2)
        r.extend(rows, versions)
        return sample([0] + [1] * (n - 1), [0.0] + [-1.0] * (n - 1), [-1] + [0] * (n - 1), r, ids)

    scorer = Scorer(model, info)
    on, off = scorer.score(sample_with(rows, [0] * (n - 1)))
    want = [0.0] + [plain[t - 1, ids[t]].item() for t in range(1, n)]
    assert on == pytest.approx(want, abs=1e-5) and off == pytest.approx(want, abs=1e-5)
    assert scorer.decisions == 2 * (n - 1) and scorer.mismatch_frac == 0.0

    other = (rows + 1) % 8  # experts the model did not choose, at every position
    scorer = Scorer(model, info)
    on, off = scorer.score(sample_with(other, [0, 0, 1, 1, 1]), count_version=1)
    assert off == pytest.approx(want, abs=1e-5) and on != pytest.approx(want, abs=1e-5)
    assert scorer.decisions == 2 * 3 and scorer.mismatch_frac == 1.0  # only the version-1 positions


def test_metric_total_sums_the_samples_of_one_metric() -> None:
    text = ("# HELP vllm:generation_tokens_total Number of generation tokens processed.\n"
            "# TYPE vllm:generation_tokens_total counter\n"
            'vllm:generation_tokens_total{engine="0",model_name="base"} 120.0\n'
            'vllm:generation_tokens_total{engine="1",model_name="base"} 30.0\n'
            'vllm:generation_tokens_total_created{engine="0"} 1.7e9\n'
            "vllm:prompt_tokens_total 99.0\n")
    assert metric_total(text, "vllm:generation_tokens_total") == 150.0
    assert metric_total(text, "vllm:prompt_tokens_total") == 99.0
    assert metric_total(text, "vllm:request_success_total") is None


def test_the_command_line_gives_every_setting_the_measurement_reads(monkeypatch, capsys) -> None:
    """``_measure`` reads ``args.chat_template``: the parser must define it (it did not, and the bench failed
    right after its engine started)."""
    from agentrl.tools.bench import routing as bench

    seen = {}

    async def measure(args):
        seen.update(vars(args))
        return {"ok": True}

    monkeypatch.setattr(bench, "_measure", measure)
    assert bench.main(["--json", "--chat-template", "hermes"]) == 0
    assert seen["chat_template"] == "hermes" and capsys.readouterr().out.strip() == '{"ok": true}'
