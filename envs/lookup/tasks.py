"""Multi-hop questions over generated worlds, their splits, and the exact-match answer check.

A task is one world (its ``seed``) and one question about it: a start entity named in the question (a
person, an organisation or a city) and a chain of 1 to 3 relations to follow from it, drawn uniformly; the
answer is the name of the last entity reached. No entity appears twice on a chain, so the answer is never the
start. Solving a task takes ``len(relations) + 1`` lookups: a search for the start, then an ``open`` of the
start and of every entity in between (a page names each relation's target and its id).

Split rule (train and test are disjoint by construction): train task ``i`` is asked in world ``i``, test task
``i`` in world ``TEST_WORLDS + i``; the question of each task is drawn with a ``random.Random`` seeded by its
world's seed.
"""

from __future__ import annotations

import random
import re
from typing import Any

from agentrl.core.errors import EnvError
from agentrl.environment.tasks import TaskSourceError
from agentrl.envs.lookup.world import RELATIONS, Entity, World, world

TEST_WORLDS = 1_000_000
"""The first world seed of the test split; train worlds are numbered from 0."""

START_KINDS = ("person", "organisation", "city")
"""Kinds of entity a question starts from (each has a look-alike in its world)."""

FINAL: dict[tuple[str, ...], str] = {
    ("born_in", "country"): "In which country was {x} born?",
    ("headquarters", "country"): "In which country is {x} headquartered?",
    ("born_in",): "In which city was {x} born?",
    ("works_for",): "Which organisation does {x} work for?",
    ("spouse",): "Who is {x} married to?",
    ("founder",): "Who founded {x}?",
    ("headquarters",): "In which city is {x} headquartered?",
    ("country",): "In which country is {x}?",
    ("capital",): "What is the capital of {x}?",
}
"""Question templates for the last one or two relations of a chain (the longest that fits is used)."""

INNER: dict[str, str] = {
    "born_in": "the birthplace of {x}",
    "works_for": "the employer of {x}",
    "spouse": "the spouse of {x}",
    "founder": "the founder of {x}",
    "headquarters": "the headquarters city of {x}",
    "country": "the country of {x}",
    "capital": "the capital of {x}",
}
"""Noun phrases for the relations before the last template."""

_PREFIX = re.compile(r"^(?:(?:the )?(?:final )?answer(?: is)?|it is)\s+")


class LookupTaskError(EnvError, ValueError):
    """A lookup task is malformed: unknown relations, a start that is not in its world, a wrong answer."""

    code = "env.lookup.task"


def normalize(text: str) -> str:
    """Lower case, punctuation as spaces, whitespace collapsed, and a leading "the answer is" dropped:
    ``"  The answer is: Port  Alder." -> "port alder"``."""
    plain = " ".join(re.sub(r"[^a-z0-9]+", " ", str(text).lower()).split())
    return _PREFIX.sub("", plain)


def question(start: str, relations: list[str]) -> str:
    """The question that asks for the end of ``relations`` followed from the entity named ``start``."""
    for n in (2, 1):
        template = FINAL.get(tuple(relations[-n:])) if len(relations) >= n else None
        if template is not None:
            phrase = start
            for relation in relations[:-n]:
                phrase = INNER[relation].format(x=phrase)
            return template.format(x=phrase)
    raise LookupTaskError(f"no question template for relations {relations}")  # pragma: no cover (FINAL covers all)


def chain(w: World, start: str, relations: list[str]) -> list[Entity]:
    """The entities a task's chain visits, the start first and the answer last."""
    unknown = [r for r in relations if r not in RELATIONS]
    if unknown or not relations:
        raise LookupTaskError(f"relations must be 1 or more of {sorted(RELATIONS)}; got {relations}")
    try:
        path = [w.named(start)]
    except StopIteration:
        raise LookupTaskError(f"world {w.seed} has no entity named {start!r}") from None
    for relation in relations:
        nxt = w.follow(path[-1], relation)
        if nxt is None:
            raise LookupTaskError(f"{path[-1].name} ({path[-1].kind}) has no {relation!r} in world {w.seed}")
        path.append(nxt)
    return path


def _draw(w: World, rng: random.Random, hops: int) -> tuple[str, list[str]]:
    """A start entity and a chain of ``hops`` relations from it that visits no entity twice."""
    starts = sorted((e for e in w.entities.values() if e.kind in START_KINDS), key=lambda e: int(e.id[1:]))
    for _ in range(10_000):
        path = [rng.choice(starts)]
        relations: list[str] = []
        while len(relations) < hops:
            options = [r for r in sorted(path[-1].links) if w.entities[path[-1].links[r]] not in path]
            if not options:
                break
            relations.append(rng.choice(options))
            path.append(w.entities[path[-1].links[relations[-1]]])
        if len(relations) == hops:
            return path[0].name, relations
    raise LookupTaskError(f"world {w.seed} has no chain of {hops} relations")  # pragma: no cover (people have)


def make_task(split: str, i: int) -> dict[str, Any]:
    """Task ``i`` of ``split``: ``{"id", "seed", "start", "relations", "question", "answer"}``."""
    seed = i if split == "train" else TEST_WORLDS + i
    rng = random.Random(f"lookup-question:{seed}")
    w = world(seed)
    start, relations = _draw(w, rng, rng.choice((1, 2, 3)))
    return {"id": f"lookup-{split}-{i}", "seed": seed, "start": start, "relations": relations,
            "question": question(start, relations), "answer": chain(w, start, relations)[-1].name}


def make_tasks(split: str, n: int) -> list[dict[str, Any]]:
    """The first ``n`` tasks of ``split`` ("train" or "test"), deterministic."""
    if split not in ("train", "test"):
        raise TaskSourceError(f"unknown split {split!r}; expected 'train' or 'test'")
    if split == "train" and n > TEST_WORLDS:
        raise TaskSourceError(f"at most {TEST_WORLDS} train tasks (later worlds are the test split's)")
    return [make_task(split, i) for i in range(n)]


def check_task(task: dict[str, Any]) -> list[Entity]:
    """The chain of ``task`` (a task from a file included), after checking that it is well formed and that
    its answer is the chain's end; raises `LookupTaskError` naming the task otherwise."""
    where = f"lookup task {task.get('id')!r}"
    if not isinstance(task.get("seed"), int) or not isinstance(task.get("start"), str):
        raise LookupTaskError(f"{where}: needs an integer 'seed' and a string 'start'")
    relations = task.get("relations")
    if not isinstance(relations, list):
        raise LookupTaskError(f"{where}: 'relations' must be a list of relation names")
    try:
        path = chain(world(task["seed"]), task["start"], relations)
    except LookupTaskError as e:
        raise LookupTaskError(f"{where}: {e}") from None
    if normalize(path[-1].name) != normalize(str(task.get("answer", ""))):
        raise LookupTaskError(f"{where}: its answer {task.get('answer')!r} is not the chain's end {path[-1].name!r}")
    return path
