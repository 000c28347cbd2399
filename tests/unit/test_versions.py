"""Per-token policy versions: engine spans win, anything else is the send-time version (never newer), and a
label that is not a policy version is an error, never skipped."""

from __future__ import annotations

import pytest

from agentrl.inference.wire import Generation
from agentrl.versions import VersionLabelError, engine_label, parse_engine_label, token_versions


def gen(n: int, spans: list[tuple[str | None, int, int]] | None) -> Generation:
    return Generation(token_ids=list(range(n)), logprobs=[0.0] * n, finish_reason="stop", weight_versions=spans,
                      routed_experts=None, endpoint="x")


def test_spans_tag_each_token_with_the_version_that_produced_it() -> None:
    assert token_versions(gen(5, [("3", 0, 2), ("4", 2, 5)]), sent_version=3) == [3, 3, 4, 4, 4]


def test_without_spans_tokens_carry_the_send_time_version() -> None:
    """The completions fallback returns no spans: a generation that spanned an update (3 -> 4) is tagged 3,
    the version in force when it was sent, never the newer one read after the answer."""
    assert token_versions(gen(4, None), sent_version=3) == [3, 3, 3, 3]
    assert token_versions(gen(4, [(None, 0, 4)]), sent_version=3) == [3] * 4, "an unlabelled engine"
    assert token_versions(gen(4, [("default", 0, 4)]), sent_version=3) == [3] * 4, "vLLM's initial label"
    assert token_versions(gen(4, [("4", 2, 4)]), sent_version=3) == [3, 3, 4, 4], "gaps keep the send version"


def test_foreign_labels_are_errors() -> None:
    for label in ("v2", "policy-7", "-1", "1.5"):
        with pytest.raises(VersionLabelError, match="not an agentrl policy version"):
            token_versions(gen(2, [(label, 0, 2)]), sent_version=0)
    assert parse_engine_label(engine_label(12)) == 12
    with pytest.raises(ValueError):
        engine_label(-1)
