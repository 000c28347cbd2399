"""Per-token policy versions: engine spans win, anything else is the send-time version (never newer), and a
label that is not a policy version is an error, never skipped."""

from __future__ import annotations

import pytest

from agentrl.core.versions import VersionLabelError, engine_label, parse_engine_label, token_versions
from agentrl.inference.wire import Generation


def gen(n: int, spans: list[tuple[str | None, int, int]] | None) -> Generation:
    return Generation(token_ids=list(range(n)), logprobs=[0.0] * n, finish_reason="stop", weight_versions=spans,
                      endpoint="x")


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


def test_policy_version_is_one_owner_that_tells_its_watchers() -> None:
    from agentrl.core.versions import PolicyVersion

    version = PolicyVersion(3)
    seen: list[int] = []
    stop = version.watch(seen.append)
    assert (version.value, version()) == (3, 3)
    assert version.bump() == 4
    version.advance(4)  # no change is still monotone
    version.advance(7)  # a resume restores its checkpoint's version
    assert seen == [4, 4, 7]
    with pytest.raises(ValueError, match="backwards"):
        version.advance(6)
    stop()
    version.bump()
    assert seen == [4, 4, 7] and version() == 8
    for bad in (-1, True, 1.0):
        with pytest.raises(ValueError):
            PolicyVersion(bad)  # type: ignore[arg-type]


def test_staleness_is_one_rule_for_groups_tokens_and_summaries() -> None:
    from agentrl.core.versions import staleness, staleness_stats, token_staleness

    assert staleness(5, 3) == 2 and staleness(5, 5) == 0
    # model tokens only (-1: tool tokens), and with a mask only the tokens it marks
    assert token_staleness(5, [-1, 3, 4, 5]) == [2, 1, 0]
    assert token_staleness(5, [-1, 3, 4, 5], [0, 0, 1, 1]) == [1, 0]
    with pytest.raises(ValueError):
        token_staleness(5, [3, 4], [1])
    assert staleness_stats([2, 1, 0]) == {"staleness_mean": 1.0, "staleness_max": 2}
    assert staleness_stats([]) == {"staleness_mean": 0.0, "staleness_max": 0}


def test_the_weights_version_runs_one_ahead_while_an_update_is_made_live() -> None:
    from agentrl.core.versions import PolicyVersion

    v = PolicyVersion(4)
    assert v.weights == v.value == 4
    v.updating()
    assert (v.value, v.weights) == (4, 5), "the trainer holds the next version's weights until the bump"
    assert v.bump() == 5 and v.weights == 5
