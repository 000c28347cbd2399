"""A small offline knowledge base, generated from a seed: people, organisations, cities and countries.

Every world has 3 countries, 8 cities, 6 organisations and 12 people (29 entities), with fictional names from
the fixed word lists below, so no fact can be known in advance. Names come in look-alike pairs, the
distractors a search has to tell apart: two cities share a word (``Port Alder``, ``Alder Falls``), two
organisations share a word (``Kestrel Mining``, ``Kestrel Press``), two people share a surname. Entity ids
(``e1`` .. ``e29``) are shuffled, so an id says nothing about its entity.

Relations (each a function: at most one target per entity):

- person: ``born_in`` (a city), ``works_for`` (an organisation), ``spouse`` (a person; 8 of 12 are married);
- organisation: ``founder`` (a person), ``headquarters`` (a city);
- city: ``country``; country: ``capital`` (one of its cities).

`search` ranks entities by the words of their name that a query shares; `page` renders an entity as a few
lines, each relation with its target's name and id, so that an agent can follow it with ``open``.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass, field

FIRST_NAMES = (
    "Ada", "Bram", "Celia", "Dario", "Edda", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Kaia", "Lukas",
    "Mina", "Nils", "Orla", "Pavel", "Quinn", "Rosa", "Sven", "Talia", "Ugo", "Vera", "Wim", "Xenia",
)  # fmt: skip
SURNAMES = (
    "Brandt", "Castell", "Dorn", "Eskel", "Falk", "Grau", "Holm", "Ivers", "Janke", "Kroll", "Lind", "Marek",
    "Norden", "Oster", "Pryce", "Quist", "Rask", "Stahl",
)  # fmt: skip
COUNTRIES = (
    "Norvania", "Estmark", "Valdoria", "Quellan", "Bellmarch", "Caldoria", "Dravenia", "Farlund", "Galdina",
    "Lorvik", "Tessarin", "Marovia",
)  # fmt: skip
CITY_WORDS = (
    "Alder", "Birch", "Cedar", "Elm", "Fern", "Hazel", "Linden", "Maple", "Oak", "Rowan", "Willow", "Thorn",
)  # fmt: skip
CITY_FORMS = ("Port {}", "{} Falls", "New {}", "{} Bay", "{} Hill", "Upper {}", "Fort {}", "{} Crossing")
ORG_WORDS = (
    "Kestrel", "Granite", "Summit", "Harbor", "Beacon", "Copper", "Falcon", "Juniper", "Meridian", "Orchid",
    "Pioneer", "Lantern",
)  # fmt: skip
INDUSTRIES = ("Mining", "Shipping", "Bank", "Press", "Foods", "Textiles", "Robotics", "Energy")

RELATIONS: dict[str, tuple[str, str, str]] = {
    "born_in": ("person", "city", "born in"),
    "works_for": ("person", "organisation", "works for"),
    "spouse": ("person", "person", "married to"),
    "founder": ("organisation", "person", "founded by"),
    "headquarters": ("organisation", "city", "headquarters"),
    "country": ("city", "country", "country"),
    "capital": ("country", "city", "capital"),
}
"""Relation name -> (kind of the source, kind of the target, its label on the source's page)."""

SEARCH_RESULTS = 5
"""Results one search returns at most."""

_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    """The lower-case words of ``text`` (letters and digits; everything else separates)."""
    return _WORD.findall(text.lower())


@dataclass(frozen=True)
class Entity:
    """One entity: its id, kind, name, relations (name -> target id) and plain facts (label, value)."""

    id: str
    kind: str
    name: str
    links: dict[str, str] = field(default_factory=dict)
    facts: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class World:
    """The entities of one seed, by id."""

    seed: int
    entities: dict[str, Entity]

    def named(self, name: str) -> Entity:
        """The entity whose name is ``name`` (names are unique within a world)."""
        return next(e for e in self.entities.values() if e.name == name)

    def follow(self, entity: Entity, relation: str) -> Entity | None:
        """The target of ``relation`` from ``entity``, or None when it has none."""
        target = entity.links.get(relation)
        return self.entities[target] if target is not None else None

    def search(self, query: str, limit: int = SEARCH_RESULTS) -> list[Entity]:
        """Entities whose name shares a word with ``query``: most shared words first, then fewest other words
        in the name (an exact name comes first), then by id number."""
        wanted = set(words(query))
        scored = []
        for e in self.entities.values():
            name = set(words(e.name))
            shared = len(wanted & name)
            if shared:
                scored.append((-shared, len(name - wanted), int(e.id[1:]), e))
        return [e for *_, e in sorted(scored, key=lambda s: s[:3])][:limit]

    def page(self, entity: Entity) -> str:
        """The entity as a few lines: a title, then each relation (target name and id), then its facts."""
        lines = [f"{entity.name} ({entity.kind}) [{entity.id}]"]
        for relation, target in entity.links.items():
            lines.append(f"{RELATIONS[relation][2]}: {self.entities[target].name} [{target}]")
        lines += [f"{label}: {value}" for label, value in entity.facts]
        return "\n".join(lines)


@dataclass
class _Draft:
    kind: str
    name: str
    links: dict[str, int] = field(default_factory=dict)
    facts: list[tuple[str, str]] = field(default_factory=list)


def _pairs(rng: random.Random, heads: tuple[str, ...], tails: tuple[str, ...], n: int, form: str) -> list[str]:
    """``2 * n`` names: ``n`` heads, each with two different tails, written with ``form``."""
    out = []
    for head in rng.sample(heads, n):
        out += [form.format(head=head, tail=tail) for tail in rng.sample(tails, 2)]
    return out


def _places(rng: random.Random, drafts: list[_Draft]) -> tuple[list[int], list[int]]:
    """Add the countries and cities; return their indexes in ``drafts``."""
    countries = [len(drafts) + i for i in range(3)]
    drafts += [_Draft("country", name) for name in rng.sample(COUNTRIES, 3)]
    cities = []
    for word in rng.sample(CITY_WORDS, 4):
        for form in rng.sample(CITY_FORMS, 2):
            cities.append(len(drafts))
            drafts.append(_Draft("city", form.format(word), facts=[("population", f"{rng.randrange(20, 900)},000")]))
    order = rng.sample(cities, len(cities))
    for i, city in enumerate(order):
        country = countries[i % 3]
        drafts[city].links["country"] = country
        if i < 3:
            drafts[country].links["capital"] = city
    return countries, cities


def _generate(seed: int) -> World:
    rng = random.Random(f"lookup-world:{seed}")
    drafts: list[_Draft] = []
    _, cities = _places(rng, drafts)
    orgs = list(range(len(drafts), len(drafts) + 6))
    drafts += [_Draft("organisation", name, facts=[("founded", str(rng.randint(1880, 2015)))])
               for name in _pairs(rng, ORG_WORDS, INDUSTRIES, 3, "{head} {tail}")]
    people = list(range(len(drafts), len(drafts) + 12))
    first = rng.sample(FIRST_NAMES, 12)
    surnames = [s for s in rng.sample(SURNAMES, 6) for _ in range(2)]
    for given, surname in zip(first, surnames, strict=True):
        drafts.append(_Draft("person", f"{given} {surname}", facts=[("born", str(rng.randint(1930, 2000)))]))
    for p in people:
        drafts[p].links.update(born_in=rng.choice(cities), works_for=rng.choice(orgs))
    married = rng.sample(people, 8)
    for a, b in zip(married[::2], married[1::2], strict=True):
        drafts[a].links["spouse"], drafts[b].links["spouse"] = b, a
    for o in orgs:
        drafts[o].links.update(founder=rng.choice(people), headquarters=rng.choice(cities))
    numbers = rng.sample(range(1, len(drafts) + 1), len(drafts))
    ids = [f"e{n}" for n in numbers]
    entities = {}
    for i in sorted(range(len(drafts)), key=lambda i: numbers[i]):
        d = drafts[i]
        links = {r: ids[d.links[r]] for r in RELATIONS if r in d.links}
        entities[ids[i]] = Entity(ids[i], d.kind, d.name, links, tuple(d.facts))
    return World(seed, entities)


@functools.lru_cache(maxsize=512)
def world(seed: int) -> World:
    """The world of ``seed``: the same for the same seed, on every machine and Python version."""
    return _generate(seed)
