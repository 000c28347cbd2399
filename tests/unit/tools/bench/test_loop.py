"""``agentrl bench loop``'s replay: the requests an episode made, recovered from its trajectory."""

from __future__ import annotations


def test_requests_of_recovers_each_turn() -> None:
    """Each run of model tokens is one request whose prompt is everything before it."""
    from agentrl.core.types import Trajectory
    from agentrl.tools.bench.phases import requests_of

    t = Trajectory(task_id="t", env="calc", group_id="g", prompt_ids=[1, 2], completion_ids=[3, 4, 5, 6, 7, 8],
                   loss_mask=[1, 1, 0, 0, 1, 1])
    reqs = requests_of(t)
    assert [(q.prompt_ids, q.max_tokens) for q in reqs] == [([1, 2], 2), ([1, 2, 3, 4, 5, 6], 2)]


def test_adapters_takes_counts_with_the_lora_adapter_only() -> None:
    """``--adapters`` is a list of counts of at least 1, and only for ``--adapter lora`` (a merged engine
    serves one policy); bad values stop at the parser, before any engine starts."""
    import pytest

    from agentrl.tools.bench.loop import main

    for bad in (["--adapter", "lora", "--adapters", "0,4"], ["--adapter", "lora", "--adapters", "four"],
                ["--adapter", "merged", "--adapters", "1,4"], ["--adapters", "4"]):
        with pytest.raises(SystemExit) as exc:
            main(bad)
        assert exc.value.code == 2, bad


async def test_raw_requests_spread_over_the_named_adapters() -> None:
    """A list of adapter names: episode ``i`` names adapter ``i % N``, every turn of it the same adapter."""
    from types import SimpleNamespace

    from agentrl.tools.bench.phases import Request, run_raw_phase

    seen: list[tuple[str, str | None]] = []

    class _Client:
        async def generate(self, prompt_ids: list[int], *, max_tokens: int, key: str, model: str | None,
                           **_: object) -> SimpleNamespace:
            seen.append((key, model))
            return SimpleNamespace(token_ids=[0] * max_tokens)

    episodes = [[Request([1], 2), Request([1, 2, 3], 1)] for _ in range(5)]
    sampling = SimpleNamespace(temperature=1.0, top_p=1.0, top_k=0)
    res = await run_raw_phase(episodes, _Client(), sampling, 2, "salt", model=["a", "b"])
    assert res.tokens == 15 and res.requests == 10
    by_key: dict[str, set] = {}
    for key, model in seen:
        by_key.setdefault(key, set()).add(model)
    assert all(len(m) == 1 for m in by_key.values())  # an episode keeps its adapter
    assert sorted(next(iter(m)) for m in by_key.values()) == ["a", "a", "a", "b", "b"]


async def test_a_groups_episodes_name_one_adapter() -> None:
    """``per`` = the group size: consecutive episodes of a group name the same adapter, groups spread over them."""
    from types import SimpleNamespace

    from agentrl.tools.bench.phases import Request, run_raw_phase

    by_key: dict[str, str | None] = {}
    order: list[str] = []

    class _Client:
        async def generate(self, prompt_ids: list[int], *, max_tokens: int, key: str, model: str | None,
                           **_: object) -> SimpleNamespace:
            if key not in by_key:
                order.append(key)
            by_key[key] = model
            return SimpleNamespace(token_ids=[0] * max_tokens)

    episodes = [[Request([i], 1)] for i in range(6)]  # three groups of two
    sampling = SimpleNamespace(temperature=1.0, top_p=1.0, top_k=0)
    await run_raw_phase(episodes, _Client(), sampling, 1, "salt", model=["a", "b"], per=2)
    assert [by_key[k] for k in order] == ["a", "a", "b", "b", "a", "a"]
