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
