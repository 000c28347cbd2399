"""Sampling masks: the compact per-position encoding (exact in every form, the smallest chosen), the record's
checks, and a whole episode whose fake engine returns masks, laid over the completion with count-0 rows for the
tool observations and carried into the trainer sample behind the prompt."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from agentrl.config.run import SamplingConfig
from agentrl.core.masks import SamplingMask, SamplingMaskError, decode_row, encode_row, row_form
from agentrl.core.types import StopReason, TokenDataError, Trajectory
from agentrl.inference.wire import Generation
from agentrl.orchestrator.samples import sample_of
from agentrl.rollout.chat import ChatFormat
from agentrl.rollout.loop import run_episode
from agentrl.tools.modelgen.tokenizer import train_tokenizer
from agentrl.tracking.samples import episode_row
from tests.unit.rollout.test_loop import Adder, call

V = 400


@pytest.fixture(scope="module")
def chat() -> ChatFormat:
    corpus = ["The answer is 42. What is 3 + 4?", '{"name": "add", "arguments": {"a": 1}}'] * 20
    return ChatFormat(train_tokenizer(corpus, vocab_size=V))


@pytest.mark.parametrize("vocab", [10, 400, 49_152, 70_000])
def test_every_row_round_trips_in_the_smallest_exact_form(vocab: int) -> None:
    rng = np.random.default_rng(vocab)
    for count in sorted({1, 3, max(1, vocab // 16), vocab // 2, vocab - 3, vocab - 1}):
        kept = np.zeros(vocab, dtype=bool)
        kept[rng.choice(vocab, count, replace=False)] = True
        n, data = encode_row(kept, vocab)
        assert n == count and np.array_equal(decode_row(n, data, vocab), kept)
        w = 2 if vocab <= 65_536 else 4
        assert len(data) == min(count * w, (vocab - count) * w, (vocab + 7) // 8) == row_form(n, vocab)[1]
    assert encode_row(np.ones(vocab, dtype=bool), vocab) == (0, b"")  # nothing cut: no bytes


def test_bad_rows_and_records_are_refused() -> None:
    with pytest.raises(SamplingMaskError, match="kept no token"):
        encode_row(np.zeros(V, dtype=bool), V)
    with pytest.raises(SamplingMaskError, match="takes 6 bytes"):
        decode_row(3, b"\x01\x00", V)
    with pytest.raises(SamplingMaskError, match="names token"):
        decode_row(1, np.array([V + 5], np.uint16).tobytes(), V)
    mask = SamplingMask(vocab=V)
    with pytest.raises(SamplingMaskError, match="take 4 bytes"):
        mask.extend([2], b"\x00")
    mask.extend([2], np.array([4, 9], np.uint16).tobytes())
    with pytest.raises(SamplingMaskError, match="not the 3 tokens"):
        mask.check(3)
    traj = Trajectory(task_id="t", env="e", completion_ids=[4, 5], loss_mask=[1, 1], logprobs=[0.0, 0.0],
                      versions=[0, 0], sampling_mask=mask)
    with pytest.raises(ValueError, match="cover 1 positions"):
        traj.check()  # a mask that does not cover the completion
    assert issubclass(SamplingMaskError, ValueError) and not issubclass(SamplingMaskError, TokenDataError)


class MaskingEngine:
    """Replies with scripted texts, each token's kept set the token and its next two ids (top-k 3)."""

    def __init__(self, chat: ChatFormat, texts: list[str]) -> None:
        self.chat, self.texts = chat, list(texts)
        self.kwargs: list[dict[str, Any]] = []

    async def generate(self, prompt_ids: list[int], **kw: Any) -> Generation:
        self.kwargs.append(kw)
        ids = [*self.chat.encode(self.texts.pop(0)), self.chat.eos_token_id]
        mask = SamplingMask(vocab=V)
        for tok in ids:
            kept = np.zeros(V, dtype=bool)
            kept[[tok, (tok + 1) % V, (tok + 2) % V]] = True
            count, data = encode_row(kept, V)
            mask.extend([count], data)
        return Generation(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop", weight_versions=None,
                          endpoint="fake", sampling_mask=mask if kw.get("sampling_mask") else None)


async def test_an_episode_lays_each_turns_masks_over_its_tokens(chat: ChatFormat) -> None:
    engine = MaskingEngine(chat, [call("add", a=3, b=4), "The answer is 7."])
    sampling = SamplingConfig(top_k=3, top_p=0.9, min_p=0.05)
    traj = await run_episode(Adder, {"id": "t"}, engine, chat, sampling, sampling_masks=True)
    assert traj.stop_reason == StopReason.COMPLETED and traj.num_turns == 2
    traj.check()
    assert all(kw["sampling_mask"] and (kw["top_k"], kw["top_p"], kw["min_p"]) == (3, 0.9, 0.05)
               for kw in engine.kwargs)
    mask = traj.sampling_mask
    assert mask is not None and mask.n == len(traj.completion_ids)
    for t, (tok, m) in enumerate(zip(traj.completion_ids, traj.loss_mask, strict=True)):
        if m:  # a model token: its own kept set
            assert mask.counts[t] == 3 and mask.row(t)[tok] and mask.row(t)[(tok + 2) % V]
        else:  # the tool observation: never sampled
            assert mask.counts[t] == 0
    sample = sample_of(traj, 1.0)  # behind the prompt, in the trainer's positions
    assert sample.sampling_mask is not None and sample.sampling_mask.n == len(sample.input_ids)
    p = len(traj.prompt_ids)
    assert [i for i, _ in sample.sampling_mask.rows()] == [p + i for i, _ in mask.rows()]
    again = Trajectory.model_validate_json(traj.model_dump_json())  # base64 in JSON
    assert again.sampling_mask == mask
    row = episode_row(traj, step=1)  # a run's sample file says how sampling cut the episode
    assert row["temperature"] == 1.0 and row["sampling_mask"]["masked_tokens"] == traj.num_model_tokens
    assert row["sampling_mask"]["kept_tokens_mean"] == 3 and row["sampling_mask"]["vocab"] == V


@pytest.mark.parametrize(("sampling", "asked"), [(SamplingConfig(), True), (SamplingConfig(top_k=3), False)],
                         ids=["untruncated", "not-asked"])
async def test_no_mask_is_asked_for_without_truncation_or_without_the_flag(chat: ChatFormat, sampling: SamplingConfig,
                                                                          asked: bool) -> None:
    engine = MaskingEngine(chat, ["The answer is 7."])
    traj = await run_episode(Adder, {"id": "t"}, engine, chat, sampling, sampling_masks=asked)
    assert traj.sampling_mask is None and all("sampling_mask" not in kw for kw in engine.kwargs)
