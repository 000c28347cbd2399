"""`LookupEnv`: multi-hop questions over a generated knowledge base, answered with ``search`` and ``open``.

An episode: the model reads a question about its world ("In which country was the founder of Kestrel Mining
born?"), searches for the entity it names, opens its page, follows the page's links with ``open`` (one per
relation on the way) and calls ``answer`` with the name it found: 2 to 4 lookups and the answer. The reward is
1.0 when the answer is the right name (exact match after `normalize`), else 0.0.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, ClassVar

from agentrl.core.types import Message, message_field, tool_call_names
from agentrl.environment.base import Environment, Task, ToolError, tool
from agentrl.environment.tasks import check_split
from agentrl.envs.lookup.tasks import check_task, make_tasks, normalize
from agentrl.envs.lookup.world import World, words, world

SPLIT_SIZES = {"train": 2000, "test": 200}
MAX_QUERY_CHARS = 200
LOOKUP_TOOLS = ("search", "open")


@functools.cache
def _cached_tasks(split: str) -> tuple[dict[str, Any], ...]:
    return tuple(make_tasks(split, SPLIT_SIZES[split]))


def search_text(w: World, query: str) -> str:
    """What ``search(query)`` shows: one ``id name (kind)`` line per result, best first."""
    if len(query) > MAX_QUERY_CHARS:
        raise ToolError(f"query too long ({len(query)} characters, limit {MAX_QUERY_CHARS})")
    if not words(query):
        raise ToolError('search needs words of a name, e.g. search(query="Kestrel Mining")')
    found = w.search(query)
    if not found:
        return f"No entity matches {query!r}. Search for words of a name."
    return "\n".join(f"{e.id} {e.name} ({e.kind})" for e in found)


def open_text(w: World, entity_id: str) -> str:
    """What ``open(id)`` shows: the entity's page (``[e12]``, ``E12`` and ``e12`` all name entity e12)."""
    key = entity_id.strip().strip("[]").strip().lower()
    if key not in w.entities:
        raise ToolError(f"no entity with id {entity_id!r}; ids look like e12 and come from search results "
                        "or page links")
    return w.page(w.entities[key])


class LookupEnv(Environment):
    """Multi-hop questions over a seeded offline knowledge base (2000 train / 200 test tasks)."""

    name: ClassVar[str] = "lookup"
    system_prompt: ClassVar[str | None] = (
        "You answer questions about a small encyclopedia of fictional people, organisations, cities and "
        "countries. search(query) finds entities by name; open(id) shows an entity's page, whose lines link "
        "to other entities by id. Similar names are different entities: pick the exact one. When you know the "
        "answer, call answer with just the name."
    )
    max_turns: ClassVar[int] = 8
    max_tokens_per_turn: ClassVar[int] = 128
    task_fields: ClassVar[tuple[str, ...]] = ("seed", "start", "relations", "question", "answer")
    agent_time_limit_s: ClassVar[float] = 10.0
    tool_timeout_s: ClassVar[float] = 5.0

    @classmethod
    def tasks(cls, split: str = "train") -> Sequence[Task]:
        """The built-in questions of ``split`` ("train": 2000, "test": 200), generated once and cached."""
        check_split(split, SPLIT_SIZES)
        return [dict(t, relations=list(t["relations"])) for t in _cached_tasks(split)]

    @classmethod
    def check_tasks(cls, tasks: Sequence[Task]) -> None:
        """Every task names a start in its world, known relations, and the answer at the chain's end."""
        for task in tasks:
            check_task(task)

    async def reset(self, task: Task) -> str:
        self.task = task
        self.world = world(task["seed"])
        self.submitted: str | None = None
        return str(task["question"])

    @tool
    async def search(self, query: str) -> str:
        """Find entities by name: ids and names of the best matches (at most 5).

        Args:
            query: a name or words of one, e.g. "Kestrel Mining".
        """
        return search_text(self.world, query)

    @tool
    async def open(self, id: str) -> str:
        """Show an entity's page: its facts, and links to other entities as [id].

        Args:
            id: an entity id from a search result or a page, e.g. "e12".
        """
        return open_text(self.world, id)

    @tool
    async def answer(self, answer: str) -> str:
        """Give the final answer and end the episode.

        Args:
            answer: just the name, e.g. "Port Alder".
        """
        if not normalize(answer):
            raise ToolError('the answer is empty; give just the name, e.g. answer(answer="Port Alder")')
        self.submitted = answer
        self.finish()
        return f"Answer recorded: {answer}"

    @classmethod
    def reference_solution(cls, task: Task) -> list[tuple[str, dict[str, Any]]]:
        """Search the start, open it and every entity on the way, answer with the last one's name."""
        path = check_task(task)
        opens = [("open", {"id": e.id}) for e in path[:-1]]
        return [("search", {"query": path[0].name}), *opens, ("answer", {"answer": path[-1].name})]

    @classmethod
    def demonstration(cls, task: Task) -> list[dict[str, Any]]:
        """The reference solution as a conversation: each call, what the tool shows, and the answer."""
        w = world(task["seed"])
        messages: list[dict[str, Any]] = [{"role": "system", "content": cls.system_prompt},
                                          {"role": "user", "content": task["question"]}]
        for name, arguments in cls.reference_solution(task):
            call = {"type": "function", "function": {"name": name, "arguments": arguments}}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            shown = {"search": lambda a: search_text(w, a["query"]), "open": lambda a: open_text(w, a["id"]),
                     "answer": lambda a: f"Answer recorded: {a['answer']}"}[name](arguments)
            messages.append({"role": "tool", "content": shown})
        return messages

    def _given(self, messages: list[Message]) -> str | None:
        """The answer of the episode: the ``answer`` call's, else a last assistant message without calls."""
        if self.submitted is not None:
            return self.submitted
        assistant = [m for m in messages if message_field(m, "role") == "assistant"]
        if assistant and not message_field(assistant[-1], "tool_calls"):
            return message_field(assistant[-1], "content") or None
        return None

    async def reward(self, messages: list[Message]) -> dict[str, float]:
        """1.0 if the answer is the right name (see `normalize`), else 0.0; with the number of lookups."""
        given = self._given(messages)
        correct = given is not None and normalize(given) == normalize(self.task["answer"])
        lookups = sum(n in LOOKUP_TOOLS for m in messages if message_field(m, "role") == "assistant" for n in tool_call_names(m))
        return {"reward": 1.0 if correct else 0.0, "answered": 1.0 if given is not None else 0.0,
                "lookups": float(lookups)}
