"""Deterministic arithmetic word problems, generated from templates.

Each template turns a tuple of numbers (mostly 2..99) into a short story, the arithmetic expression that
solves it, and the integer answer; names, pronouns and objects only vary the wording.

Split rule (train and test are disjoint by construction): a problem is identified by its template and
its number tuple. It belongs to ``"test"`` iff ``sha256("<template>:<numbers>")`` taken modulo 10 is 0
(about 10% of all problems), and to ``"train"`` otherwise. Names and objects are not part of the key, so
no train problem is a reworded test problem. Within a split, problems are drawn with a
``random.Random`` seeded by ``(split, seed)`` and de-duplicated by the same key.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Any

from agentrl.core.errors import EnvError
from agentrl.environment.tasks import TaskSourceError


class BadTemplate(EnvError, AssertionError):
    """A problem template produced an answer that is not an integer (a bug in the template)."""

    code = "env.calc.bad_template"


class NotEnoughTasks(EnvError, RuntimeError):
    """A split has fewer distinct problems than were asked for."""

    code = "env.calc.not_enough_tasks"


NAMES: list[tuple[str, str]] = [
    ("Ann", "She"), ("Ben", "He"), ("Cara", "She"), ("Dev", "He"), ("Eli", "He"), ("Fay", "She"),
    ("Gus", "He"), ("Hana", "She"), ("Ivy", "She"), ("Jon", "He"), ("Kim", "She"), ("Leo", "He"),
    ("Mia", "She"), ("Noah", "He"), ("Omar", "He"), ("Pia", "She"), ("Raj", "He"), ("Sara", "She"),
    ("Tom", "He"), ("Uma", "She"), ("Wes", "He"), ("Zoe", "She"),
]  # fmt: skip
OBJECTS = [
    "apples", "pens", "books", "stickers", "marbles", "cards", "cookies", "coins", "shells",
    "stamps", "eggs", "candles", "balloons", "beads", "plums", "buttons",
]  # fmt: skip
CONTAINERS = [("bag", "bags"), ("box", "boxes"), ("pack", "packs"), ("jar", "jars"), ("crate", "crates")]

Problem = tuple[tuple[int, ...], str, str]
"""(numbers, question, expression)."""


def _people(rng: random.Random, k: int) -> list[tuple[str, str]]:
    return rng.sample(NAMES, k)


def _t_add(rng: random.Random) -> Problem:
    ((n, p),) = _people(rng, 1)
    a, b, obj = rng.randint(2, 99), rng.randint(2, 99), rng.choice(OBJECTS)
    q = f"{n} has {a} {obj}. {p} gets {b} more. How many {obj} does {n} have now?"
    return (a, b), q, f"{a} + {b}"


def _t_sub(rng: random.Random) -> Problem:
    ((n, p),) = _people(rng, 1)
    a = rng.randint(10, 99)
    b, obj = rng.randint(2, a - 1), rng.choice(OBJECTS)
    q = f"{n} has {a} {obj}. {p} gives {b} to a friend. How many {obj} are left?"
    return (a, b), q, f"{a} - {b}"


def _t_mul(rng: random.Random) -> Problem:
    a, b, obj = rng.randint(2, 30), rng.randint(2, 99), rng.choice(OBJECTS)
    one, many = rng.choice(CONTAINERS)
    q = f"There are {a} {many}. Each {one} holds {b} {obj}. How many {obj} are there in total?"
    return (a, b), q, f"{a} * {b}"


def _t_div(rng: random.Random) -> Problem:
    ((n, _),) = _people(rng, 1)
    b, each, obj = rng.randint(2, 12), rng.randint(2, 20), rng.choice(OBJECTS)
    a = b * each
    q = f"{n} shares {a} {obj} equally among {b} friends. How many {obj} does each friend get?"
    return (a, b), q, f"{a} / {b}"


def _t_add_mul(rng: random.Random) -> Problem:
    ((n, p),) = _people(rng, 1)
    a, b, c, obj = rng.randint(2, 99), rng.randint(2, 12), rng.randint(2, 30), rng.choice(OBJECTS)
    _, many = rng.choice(CONTAINERS)
    q = f"{n} has {a} {obj}. {p} buys {b} {many} with {c} {obj} each. How many {obj} does {n} have now?"
    return (a, b, c), q, f"{a} + {b} * {c}"


def _t_mul_sub(rng: random.Random) -> Problem:
    ((n, _),) = _people(rng, 1)
    a, b, obj = rng.randint(2, 30), rng.randint(2, 12), rng.choice(OBJECTS)
    c = rng.randint(2, min(99, a * b - 1))
    one, many = rng.choice(CONTAINERS)
    q = f"A {one} holds {a} {obj}. {n} has {b} {many} and gives away {c} {obj}. How many {obj} are left?"
    return (a, b, c), q, f"{b} * {a} - {c}"


def _t_add_sub(rng: random.Random) -> Problem:
    ((n, p),) = _people(rng, 1)
    a, b, obj = rng.randint(2, 99), rng.randint(2, 99), rng.choice(OBJECTS)
    c = rng.randint(2, min(99, a + b - 1))
    q = f"{n} has {a} {obj}. {p} finds {b} more and then loses {c}. How many {obj} does {n} have now?"
    return (a, b, c), q, f"{a} + {b} - {c}"


def _t_sum3(rng: random.Random) -> Problem:
    (n, _), (m, _), (k, _) = _people(rng, 3)
    a, b, c, obj = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 99), rng.choice(OBJECTS)
    q = f"{n} has {a} {obj}, {m} has {b} and {k} has {c}. How many {obj} do they have together?"
    return (a, b, c), q, f"{a} + {b} + {c}"


def _t_days(rng: random.Random) -> Problem:
    ((n, p),) = _people(rng, 1)
    a, b, c = rng.randint(2, 50), rng.randint(2, 50), rng.randint(2, 30)
    q = (
        f"Each day {n} reads {a} pages in the morning and {b} pages at night. "
        f"How many pages does {p.lower()} read in {c} days?"
    )
    return (a, b, c), q, f"({a} + {b}) * {c}"


def _t_split_rest(rng: random.Random) -> Problem:
    ((n, p),) = _people(rng, 1)
    c, each, obj = rng.randint(2, 9), rng.randint(2, 11), rng.choice(OBJECTS)
    b = rng.randint(2, 40)
    a = b + c * each
    one, many = rng.choice(CONTAINERS)
    q = (
        f"{n} has {a} {obj} and keeps {b} of them. {p} puts the rest equally into {c} {many}. "
        f"How many {obj} go in each {one}?"
    )
    return (a, b, c), q, f"({a} - {b}) / {c}"


def _t_wage(rng: random.Random) -> Problem:
    ((n, p),) = _people(rng, 1)
    a, b = rng.randint(2, 99), rng.randint(2, 12)
    c = rng.randint(2, min(99, a * b - 1))
    q = f"{n} earns {a} coins a day for {b} days. Then {p.lower()} spends {c} coins. How many coins are left?"
    return (a, b, c), q, f"{a} * {b} - {c}"


def _t_three_ops(rng: random.Random) -> Problem:
    ((n, _),) = _people(rng, 1)
    a, b, c, obj = rng.randint(2, 12), rng.randint(2, 30), rng.randint(2, 99), rng.choice(OBJECTS)
    d = rng.randint(2, min(99, a * b + c - 1))
    _, many = rng.choice(CONTAINERS)
    q = (
        f"{n} buys {a} {many} of {b} {obj} and {c} loose {obj}, then gives away {d}. "
        f"How many {obj} does {n} have?"
    )
    return (a, b, c, d), q, f"{a} * {b} + {c} - {d}"


TEMPLATES: dict[str, Callable[[random.Random], Problem]] = {
    "add": _t_add,
    "sub": _t_sub,
    "mul": _t_mul,
    "div": _t_div,
    "add_mul": _t_add_mul,
    "mul_sub": _t_mul_sub,
    "add_sub": _t_add_sub,
    "sum3": _t_sum3,
    "days": _t_days,
    "split_rest": _t_split_rest,
    "wage": _t_wage,
    "three_ops": _t_three_ops,
}


def split_of(template: str, numbers: tuple[int, ...]) -> str:
    """The split a problem belongs to: ``"test"`` for about 10% of (template, numbers) keys, else ``"train"``."""
    digest = hashlib.sha256(f"{template}:{','.join(map(str, numbers))}".encode()).digest()
    return "test" if int.from_bytes(digest[:8], "big") % 10 == 0 else "train"


def _evaluate(expression: str) -> int:
    from agentrl.envs.calc.evaluator import safe_eval

    value = safe_eval(expression)
    if not isinstance(value, int):
        raise BadTemplate(f"template produced a non-integer answer: {expression} = {value}")
    return value


def make_tasks(split: str, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` distinct word problems of ``split`` ("train" or "test"), deterministic in ``(split, seed)``.

    Each task is ``{"id": "calc-<split>-<i>", "question", "expression", "answer"}``.
    """
    if split not in ("train", "test"):
        raise TaskSourceError(f"unknown split {split!r}; expected 'train' or 'test'")
    rng = random.Random(f"calc:{split}:{seed}")
    names = sorted(TEMPLATES)
    seen: set[tuple[str, tuple[int, ...]]] = set()
    tasks: list[dict[str, Any]] = []
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 200 * n + 10_000:
            raise NotEnoughTasks(f"could not draw {n} distinct {split} tasks")
        template = rng.choice(names)
        numbers, question, expression = TEMPLATES[template](rng)
        key = (template, numbers)
        if key in seen or split_of(template, numbers) != split:
            continue
        seen.add(key)
        tasks.append(
            {
                "id": f"calc-{split}-{len(tasks)}",
                "question": question,
                "expression": expression,
                "answer": _evaluate(expression),
            }
        )
    return tasks
