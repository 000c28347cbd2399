"""The metrics file's readers: records of one kind, and the books of groups at the end of a run."""

from __future__ import annotations

from pathlib import Path


def test_the_books_of_groups_count_what_was_lost_without_a_record(tmp_path: Path) -> None:
    from agentrl.orchestrator.metrics import groups_lost_unrecorded, records_of

    books = {"groups_admitted": 10, "groups_consumed": 6, "groups_released": 1, "groups_dropped_stale": 1,
             "groups_dropped_capacity": 0, "groups_buffered": 1, "groups_in_flight": 0}
    assert groups_lost_unrecorded(books) == 1
    assert groups_lost_unrecorded({**books, "groups_buffered": 2}) == 0
    path = tmp_path / "metrics.jsonl"
    assert records_of(path, "train") == []  # not written yet
    path.write_text('{"kind": "train", "step": 1}\n{"kind": "groups", "step": 1}\n{"kind": "train", "step": 2}\n')
    assert [r["step"] for r in records_of(path, "train")] == [1, 2] and len(records_of(path, "groups")) == 1
