"""The agent loop's MoE routing: `_extend_routing`'s position versions and overlaps, and a whole episode
whose fake engine returns the routing of the positions it is asked for."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from agentrl.config.run import SamplingConfig
from agentrl.core.types import Routing, StopReason, Trajectory
from agentrl.inference.wire import Generation, RoutingRows
from agentrl.rollout.chat import ChatFormat
from agentrl.rollout.loop import extend_routing, run_episode
from agentrl.tools.modelgen.tokenizer import train_tokenizer
from tests.unit.rollout.test_loop import Adder, call

L, K = 2, 2


def rows_for(positions: range) -> np.ndarray:
    """Distinct routing per position: row p is ``[[p, p+1], [p+2, p+3]] % 256``."""
    return np.array([[[(p + 2 * layer + k) % 256 for k in range(K)] for layer in range(L)] for p in positions],
                    dtype=np.uint8).reshape(len(positions), L, K)


def empty_traj() -> Trajectory:
    return Trajectory(task_id="t", env="e", routing=Routing(layers=L, top_k=K))


def test_prefill_positions_take_the_first_tokens_version() -> None:
    traj = empty_traj()
    # prompt of 4 tokens, 3 sampled tokens (versions 5, 5, 6): positions 0..5 were fed forward
    extend_routing(traj.routing, RoutingRows(0, rows_for(range(6))), prompt_len=4, versions=[5, 5, 6], sent=1)
    assert traj.routing.n == 6
    np.testing.assert_array_equal(traj.routing.array(), rows_for(range(6)))
    # positions 0..3 sample the tokens at 1..4 (prompt, then output 0: v5), 4 samples output 1 (v5), 5 output 2 (v6)
    assert traj.routing.versions == [(0, 5), (5, 6)]


def test_no_sampled_tokens_falls_back_to_the_send_version() -> None:
    traj = empty_traj()
    extend_routing(traj.routing, RoutingRows(0, rows_for(range(3))), prompt_len=4, versions=[], sent=7)
    assert (traj.routing.n, traj.routing.versions) == (3, [(0, 7)])


def test_overlapping_rows_are_sliced_and_a_gap_is_ignored() -> None:
    traj = empty_traj()
    extend_routing(traj.routing, RoutingRows(0, rows_for(range(4))), prompt_len=3, versions=[1, 1], sent=1)
    assert traj.routing.n == 4
    # the next turn: prompt of 8 tokens; the engine sent rows from position 2 (overlapping 2, 3)
    extend_routing(traj.routing, RoutingRows(2, rows_for(range(2, 9))), prompt_len=8, versions=[2, 3], sent=2)
    assert traj.routing.n == 9
    np.testing.assert_array_equal(traj.routing.array(), rows_for(range(9)))
    # positions 4..6 are prefill (first token's version 2), 7 samples output 0 (v2), 8 samples output 1 (v3)
    assert traj.routing.versions == [(0, 1), (4, 2), (8, 3)]
    before = (traj.routing.ids, list(traj.routing.versions))
    extend_routing(traj.routing, RoutingRows(10, rows_for(range(10, 12))), prompt_len=11, versions=[4], sent=4)
    assert (traj.routing.ids, traj.routing.versions) == before  # a gap: rows from 10 while 9 is missing
    extend_routing(traj.routing, RoutingRows(3, rows_for(range(3, 9))), prompt_len=8, versions=[2, 3], sent=2)
    assert (traj.routing.ids, traj.routing.versions) == before  # nothing new


def test_no_routing_record_is_left_alone() -> None:
    traj = Trajectory(task_id="t", env="e")
    extend_routing(traj.routing, RoutingRows(0, rows_for(range(3))), prompt_len=2, versions=[0, 0], sent=0)
    assert traj.routing is None


# -- a whole episode -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chat() -> ChatFormat:
    corpus = ["The answer is 42. What is 3 + 4?", '{"name": "add", "arguments": {"a": 1}}'] * 20
    return ChatFormat(train_tokenizer(corpus, vocab_size=400))


class RoutedEngine:
    """Replies with scripted texts; returns the routing of positions ``routing_from .. len(prompt)+len(out)-2``
    (as an engine would: the last sampled token is never fed forward), under weight version ``turn + 3``."""

    def __init__(self, chat: ChatFormat, texts: list[str]) -> None:
        self.chat, self.texts = chat, list(texts)
        self.asked: list[tuple[int, int]] = []
        """(prompt length, routing_from) of each request."""

    async def generate(self, prompt_ids: list[int], *, routing_from: int | None = None, **kw: Any) -> Generation:
        assert routing_from is not None, "the loop did not ask for routing"
        self.asked.append((len(prompt_ids), routing_from))
        ids = [*self.chat.encode(self.texts.pop(0)), self.chat.eos_token_id]
        version = str(len(self.asked) + 2)
        end = len(prompt_ids) + len(ids) - 1
        return Generation(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop",
                          weight_versions=[(version, 0, len(ids))], endpoint="fake",
                          routing=RoutingRows(routing_from, rows_for(range(routing_from, end))))


async def test_episode_records_routing_of_every_fed_position(chat: ChatFormat) -> None:
    engine = RoutedEngine(chat, [call("add", a=3, b=4), call("add", a=1, b=2), "The answer is 7."])
    template = Routing(layers=L, top_k=K)
    traj = await run_episode(Adder, {"id": "t"}, engine, chat, SamplingConfig(), routing=template)
    assert traj.stop_reason == StopReason.COMPLETED and traj.num_turns == 3
    traj.check()
    total = len(traj.prompt_ids) + len(traj.completion_ids)
    assert traj.routing is not None and traj.routing.n == total - 1
    np.testing.assert_array_equal(traj.routing.array(), rows_for(range(total - 1)))
    # each turn asks for exactly the positions the trajectory lacks: from 0, then the previous turn's end
    outs = [len(chat.encode(t)) + 1 for t in (call("add", a=3, b=4), call("add", a=1, b=2))]
    (p0, f0), (p1, f1), (_, f2) = engine.asked
    assert (f0, f1, f2) == (0, p0 + outs[0] - 1, p1 + outs[1] - 1)
    # a turn's prefill positions carry its version; version 3 computed up to turn 1's last fed position
    assert traj.routing.versions == [(0, 3), (f1, 4), (f2, 5)]
    # the template every episode starts from stays empty: each trajectory extends its own copy
    assert traj.routing is not template and (template.n, template.versions) == (0, [])


async def test_episode_without_routing_never_asks_for_it(chat: ChatFormat) -> None:
    kwargs: list[dict[str, Any]] = []

    class Plain:
        async def generate(self, prompt_ids: list[int], **kw: Any) -> Generation:
            kwargs.append(kw)
            ids = [*chat.encode("The answer is 7."), chat.eos_token_id]
            return Generation(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop",
                              weight_versions=None, endpoint="fake")

    traj = await run_episode(Adder, {"id": "t"}, Plain(), chat, SamplingConfig())
    assert traj.stop_reason == StopReason.COMPLETED and traj.routing is None
    assert kwargs and all("routing_from" not in kw for kw in kwargs)
