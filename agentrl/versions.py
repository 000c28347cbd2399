"""The policy version: one integer, owned by the orchestrator, and how it travels.

Version ``v`` is the policy after ``v`` published updates (``v = 0``: the initial adapter). The orchestrator
is its only owner. It sends ``v`` with every train request (the trainer measures staleness against it and
counts its optimizer steps separately, as ``optimizer_step``), and after the update it publishes ``v + 1``
to the engines as their served weight label (:func:`engine_label`). The engines tag each generated token
with the label in force when it was produced (vLLM's ``weight_versions`` spans), and the agent loop reads
them back with :func:`token_versions`. Nothing else invents a version.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from agentrl.types import Trajectory

if TYPE_CHECKING:  # pragma: no cover
    from agentrl.inference.wire import Generation

UNLABELLED = frozenset({"", "None", "default"})
"""Labels of an engine whose weights were never labelled (vLLM serves ``"default"`` until the first
``POST /update_weight_version``): its tokens carry the send-time version."""


class VersionLabelError(ValueError):
    """An engine served a weight label that is not an agentrl policy version."""


def engine_label(version: int) -> str:
    """The engine's weight label for policy ``version``."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"a policy version is an integer >= 0, not {version!r}")
    return str(version)


def parse_engine_label(label: object) -> int:
    """The policy version of an engine weight label; raises ``VersionLabelError`` for anything else."""
    text = str(label).strip()
    if not text.isdigit():
        raise VersionLabelError(
            f"the engine served weight version {label!r}, which is not an agentrl policy version: another "
            "process relabelled its weights (POST /update_weight_version), or two runs share one engine")
    return int(text)


def token_versions(gen: Generation, sent_version: int) -> list[int]:
    """The policy version of each token of ``gen``.

    ``sent_version`` is the version in force when the request was sent. Tokens covered by the engine's
    weight-version spans carry their span's version; the rest (an engine that returns no spans, such as
    the ``/v1/completions`` fallback, or one never labelled) carry ``sent_version``: never newer than the
    weights that produced them, so staleness is never under-reported and the η bound cannot be fooled.
    """
    n = len(gen.token_ids)
    out = [sent_version] * n
    for label, start, end in gen.weight_versions or []:
        if label is None or str(label) in UNLABELLED:
            continue  # the engine had no label yet: keep the send-time version
        v = parse_engine_label(label)
        for i in range(max(0, start), min(n, end)):
            out[i] = v
    return out


def oldest_version(versions: Iterable[int]) -> int | None:
    """The oldest policy version among model tokens (``-1`` marks non-model tokens); None if none."""
    return min((v for v in versions if v >= 0), default=None)


def group_oldest_version(group: list[Trajectory]) -> int | None:
    """The oldest model-token version of a GRPO group: what its staleness is measured from."""
    return oldest_version(v for traj in group for v in traj.versions)


def newest_version(versions: Iterable[int]) -> int | None:
    """The newest policy version among model tokens (``-1`` marks non-model tokens); None if none."""
    return max((v for v in versions if v >= 0), default=None)


def staleness_version(versions: Iterable[int], staleness_from: str = "oldest") -> int | None:
    """The version staleness is measured from (``pipeline.staleness_from``): the oldest or the newest of the
    model tokens' ``versions``."""
    return newest_version(versions) if staleness_from == "newest" else oldest_version(versions)


def group_staleness_version(group: list[Trajectory], staleness_from: str = "oldest") -> int | None:
    """The version a GRPO group's staleness is measured from: its oldest or its newest model token."""
    return staleness_version((v for traj in group for v in traj.versions), staleness_from)
