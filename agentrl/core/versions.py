"""The policy version: one integer, owned by the orchestrator, and how it travels.

Version ``v`` is the policy after ``v`` published updates (``v = 0``: the initial adapter). The orchestrator
is its only owner, through one :class:`PolicyVersion` object that every other part reads. It sends ``v``
with every train request (the trainer measures staleness against it and counts its optimizer steps
separately, as ``optimizer_step``), and after the update it publishes ``v + 1``
to the engines as their served weight label (:func:`engine_label`). The engines tag each generated token
with the label in force when it was produced (vLLM's ``weight_versions`` spans), and the agent loop reads
them back with :func:`token_versions`. Nothing else invents a version. Staleness, wherever it is
measured, is :func:`staleness`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from agentrl.core.errors import AgentRLError, EngineError
from agentrl.core.types import Trajectory


class VersionedOutput(Protocol):
    """What :func:`token_versions` reads of an engine's answer (:class:`agentrl.inference.wire.Generation`):
    the output ids and the weight-version spans over them."""

    token_ids: list[int]
    weight_versions: list[tuple[str | None, int, int]] | None

UNLABELLED = frozenset({"", "None", "default"})
"""Labels of an engine whose weights were never labelled (vLLM serves ``"default"`` until the first
``POST /update_weight_version``): its tokens carry the send-time version."""


class VersionLabelError(EngineError, ValueError):
    """An engine served a weight label that is not an agentrl policy version."""

    code = "inference.version_label"


class PolicyVersionError(AgentRLError, ValueError):
    """A policy version is not an integer >= 0, or the current version was moved backwards."""

    code = "versions.policy_version"


def engine_label(version: int) -> str:
    """The engine's weight label for policy ``version``."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise PolicyVersionError(f"a policy version is an integer >= 0, not {version!r}")
    return str(version)


def parse_engine_label(label: object) -> int:
    """The policy version of an engine weight label; raises ``VersionLabelError`` for anything else."""
    text = str(label).strip()
    if not text.isdigit():
        raise VersionLabelError(
            f"the engine served weight version {label!r}, which is not an agentrl policy version: another "
            "process relabelled its weights (POST /update_weight_version), or two runs share one engine")
    return int(text)


def token_versions(gen: VersionedOutput, sent_version: int) -> list[int]:
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


class PolicyVersion:
    """The policy version's one owner: every other part of a run reads it from here (call it, or read
    :attr:`value`), and nothing keeps a copy of its own.

    The orchestrator makes an update live and then bumps it (:meth:`bump`); a resumed run restores its
    checkpoint's version (:meth:`advance`) before anything reads it. Watchers (the rollout buffer, whose
    producers wait on the staleness bound) are told of every change as it happens.
    """

    def __init__(self, value: int = 0) -> None:
        engine_label(value)  # the same check: an integer >= 0
        self._value = value
        self._updating = False
        self._watchers: list[Callable[[int], None]] = []

    @property
    def value(self) -> int:
        """The current policy version."""
        return self._value

    def __call__(self) -> int:
        """The current policy version (so the owner itself is the ``policy_version`` callable parts take)."""
        return self._value

    def advance(self, version: int) -> None:
        """Make ``version`` the current one (monotone) and tell every watcher."""
        if version < self._value:
            raise PolicyVersionError(f"version went backwards: {version} < {self._value}")
        engine_label(version)
        self._value = version
        for watcher in list(self._watchers):
            watcher(version)

    @property
    def weights(self) -> int:
        """The version of the trainer's weights: the current one, or the next while an update is being made
        live (between :meth:`updating` and :meth:`bump`). An engine brought back in that window gets this
        label, since it gets those weights."""
        return self._value + 1 if self._updating else self._value

    def updating(self) -> None:
        """The trainer holds the next version's weights, which the orchestrator is making live."""
        self._updating = True

    def bump(self) -> int:
        """One published update: the next version; returns it."""
        self._updating = False
        self.advance(self._value + 1)
        return self._value

    def watch(self, watcher: Callable[[int], None]) -> Callable[[], None]:
        """Call ``watcher(version)`` after every change; returns the function that stops it."""
        self._watchers.append(watcher)

        def stop() -> None:
            if watcher in self._watchers:
                self._watchers.remove(watcher)

        return stop

    def __repr__(self) -> str:
        return f"PolicyVersion({self._value})"


def staleness(trainer_version: int, version: int) -> int:
    """How many policy versions something generated by policy ``version`` (a token, or the version a group's
    staleness is measured from) is behind ``trainer_version``, the policy being trained on it.

    The one staleness rule: the buffer's η bound and histogram, the step metrics, the trainer's per-token
    statistics and the pipeline simulator all measure with it.
    """
    return trainer_version - version


def token_staleness(trainer_version: int, versions: Iterable[int],
                    mask: Iterable[int | bool] | None = None) -> list[int]:
    """The :func:`staleness` of each model token (version >= 0) of ``versions``; with ``mask`` (same
    length), only of the tokens it marks (e.g. a sample's loss tokens)."""
    if mask is None:
        return [staleness(trainer_version, v) for v in versions if v >= 0]
    return [staleness(trainer_version, v) for v, m in zip(versions, mask, strict=True) if m and v >= 0]


def past_age_cap(trainer_version: int, version: int, max_age: int) -> bool:
    """Whether a token generated by policy ``version`` is too old to train policy ``trainer_version``: its
    :func:`staleness` exceeds ``max_age`` (``pipeline.max_token_age``). The loss masks such tokens
    (:func:`agentrl.orchestrator.samples.cap_token_age`), and the pipeline simulator counts them the same way."""
    return staleness(trainer_version, version) > max_age


def staleness_stats(lags: Sequence[int]) -> dict[str, float | int]:
    """``staleness_mean`` and ``staleness_max`` of staleness values (0.0 and 0 when there are none)."""
    return {"staleness_mean": sum(lags) / len(lags) if lags else 0.0, "staleness_max": max(lags, default=0)}
