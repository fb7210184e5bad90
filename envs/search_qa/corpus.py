"""A Search-QA corpus generated from a seed: invented entities, passages about them, questions.

No QA corpus can be downloaded here, and a model must not be able to answer from memory, so the
corpus is about entities that do not exist: people, towns, companies, inventions, rivers and
mountains whose names are built from syllables. Every fact lives in exactly one passage, and the
questions ask for those facts:

- ``single``: one fact of one entity ("In which town was Mira Tevask born?").
- ``multi``, kind ``bridge``: two hops through a bridge entity ("In which town was the founder of
  Zorvex Works born?": the company's passage names the founder, the founder's passage the town).
- ``multi``, kind ``comparison``: the same fact of two entities, compared ("Which company was
  founded earlier, A or B?"), as in HotpotQA. Its answer is one of the two names in the question.

Files (JSONL, one record a line, UTF-8, keys in this order):

- ``corpus.jsonl``: ``{"id", "title", "contents"}`` with ``contents = '"Title"\\nText'``, the
  layout Search-R1 and FlashRAG use for wiki-18 (the first line is the quoted title), so their
  tools read it unchanged; ``title`` is the same title without quotes.
- ``train.jsonl`` and ``eval.jsonl``: ``{"id", "question", "golden_answers", "supporting_ids",
  "type", "kind", "hop_queries"}``. ``type`` is "single" or "multi"; ``supporting_ids`` lists the
  passages that hold the facts, one per hop in hop order; ``hop_queries`` (our addition) are the
  single-hop questions an expert searches, one per supporting passage; ``golden_answers[0]`` is
  the canonical answer, the rest are accepted variants ("Osra River", "Osra").

The two splits share no question (entities may appear in both). The same seed and size give
byte-identical files on any machine and Python version: randomness comes only from
``random.Random.random()``, whose sequence Python guarantees across versions.

Names avoid common English words and endings a stemmer would strip (Porter, which Lucene's
English analyzer applies), so every name is one distinct search term for bm25s and for Lucene.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from agentkit.core.errors import ConfigError
from agentkit.core.paths import build_folder_once, cache_dir

GENERATOR_VERSION = 1
DEFAULT_NUM_PASSAGES = 3000
MIN_PASSAGES = 100
MAX_PASSAGES = 200_000
EVAL_FRACTION = 0.1
CORPUS_FILE, TRAIN_FILE, EVAL_FILE, META_FILE = "corpus.jsonl", "train.jsonl", "eval.jsonl", "meta.json"
SPLITS = ("train", "eval")

T = TypeVar("T")


class _Rng:
    """Draws built on ``random()`` alone: its sequence is the one Python promises to keep."""

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)

    def below(self, n: int) -> int:
        return min(int(self._random.random() * n), n - 1)

    def between(self, low: int, high: int) -> int:
        """An integer in [low, high]."""
        return low + self.below(high - low + 1)

    def chance(self, p: float) -> bool:
        return self._random.random() < p

    def choice(self, items: Sequence[T]) -> T:
        return items[self.below(len(items))]

    def shuffle(self, items: list[T]) -> None:
        for i in range(len(items) - 1, 0, -1):
            j = self.below(i + 1)
            items[i], items[j] = items[j], items[i]

    def sample(self, items: Sequence[T], n: int) -> list[T]:
        pool = list(items)
        self.shuffle(pool)
        return pool[:n]


# ---------------------------------------------------------------------------------------------
# names

_ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "pr", "r", "s",
           "st", "t", "tr", "v", "z", "th", "j", "w", "sh", "kh", "y")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ei", "ou", "ua")
_INNER_CODAS = ("n", "r", "l", "m", "s")
_FINAL_CODAS = ("", "", "", "n", "r", "l", "k", "m", "th", "x", "nd", "rn", "sk", "v", "rk", "z", "sh")
# endings Porter's stemmer strips or rewrites (so a name stays one intact search term in Lucene)
_STEMMED_ENDINGS = ("s", "e", "y", "i", "ed", "ing", "er", "al", "ic", "ant", "ent", "ion", "ou", "ism", "or", "ful", "ll")
# words a name must not be: English function words (stopword lists) and frequent short words
_RESERVED = frozenset("""
about above after again against because been before being below between both could does doing down
during each from further have having here hers herself himself into itself just more most myself once
only other ours ourselves over same should some such than that their theirs them themselves then there
these they this those through under until very were what when where which while whom with would your
yours yourself yourselves
town city river mount mountain range province company works year years born founded long high metres
kilometres first later name known land water stone iron gold silver wood north south east west king
queen lord lady road bridge mill hill vale dale field ford port market
""".split())


class _Names:
    """Unique invented names; every name is a new token across the whole corpus."""

    def __init__(self, rng: _Rng) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def _word(self, syllables: int) -> str:
        parts = []
        for i in range(syllables):
            last = i == syllables - 1
            if last:
                coda = self.rng.choice(_FINAL_CODAS)
            else:
                coda = self.rng.choice(_INNER_CODAS) if self.rng.chance(0.2) else ""
            parts.append(self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + coda)
        return "".join(parts)

    def new(self, syllables: tuple[int, int] = (2, 3), min_len: int = 5, max_len: int = 11) -> str:
        for _ in range(10_000):
            word = self._word(self.rng.between(*syllables))
            if not (min_len <= len(word) <= max_len) or word in self.used or word in _RESERVED:
                continue
            if word.endswith(_STEMMED_ENDINGS):
                continue
            self.used.add(word)
            return word.capitalize()
        raise ConfigError("Ran out of invented names; ask for fewer passages.")


# ---------------------------------------------------------------------------------------------
# entities

OCCUPATIONS = ("botanist", "engineer", "painter", "cartographer", "surveyor", "composer", "chemist",
               "glassblower", "astronomer", "weaver", "shipwright", "clockmaker", "physician", "poet",
               "architect", "geologist", "printer", "brewer", "sculptor", "mathematician")
INDUSTRIES = ("textile", "shipbuilding", "glassmaking", "printing", "brewing", "mining", "railway",
              "pottery", "timber", "instrument-making", "salt", "paper", "dye", "clockmaking")
COMPANY_SUFFIXES = ("Works", "Holdings", "Foundry", "Trading", "Mills", "Industries", "Guild", "Brothers")
DEVICES = ("loom", "lamp", "pump", "press", "compass", "kiln", "lens", "engine", "valve", "sextant",
           "barometer", "telegraph", "plough", "bellows", "winch", "furnace")
PURPOSES = {
    "loom": "weaving patterned cloth", "lamp": "lighting mine shafts", "pump": "draining flooded quarries",
    "press": "printing maps", "compass": "surveying marshland", "kiln": "firing glazed tiles",
    "lens": "magnifying seeds", "engine": "hauling barges", "valve": "regulating steam boilers",
    "sextant": "navigating river deltas", "barometer": "forecasting mountain storms",
    "telegraph": "signalling between lighthouses", "plough": "turning stony soil",
    "bellows": "feeding forge fires", "winch": "lifting bells", "furnace": "smelting copper",
}
SPECIALITIES = ("smoked fish", "blue pottery", "wool fairs", "a clock tower", "a stone bridge",
                "an autumn horse market", "salt pans", "a botanical garden", "copper domes", "a lighthouse")
PRONOUNS = (("he", "his"), ("she", "her"))


@dataclass
class _Person:
    first: str
    last: str
    pronoun: tuple[str, str]
    birth_year: int
    occupation: str
    birthplace: _Town | None = None
    residence: _Town | None = None
    mentor: _Person | None = None
    pid: str = ""

    @property
    def title(self) -> str:
        return f"{self.first} {self.last}"


@dataclass
class _Town:
    name: str
    province: str
    founded: int
    population: int
    speciality: str
    river: _River | None = None
    pid: str = ""

    @property
    def title(self) -> str:
        return self.name


@dataclass
class _River:
    name: str
    length_km: int
    sea: str
    source: _Mountain | None = None
    pid: str = ""

    @property
    def title(self) -> str:
        return f"{self.name} River"


@dataclass
class _Mountain:
    name: str
    height_m: int
    range_name: str
    climbed: int = 0
    climber: _Person | None = None
    pid: str = ""

    @property
    def title(self) -> str:
        return f"Mount {self.name}"


@dataclass
class _Company:
    name: str
    suffix: str
    industry: str
    founded: int = 0
    founder: _Person | None = None
    hq: _Town | None = None
    pid: str = ""

    @property
    def title(self) -> str:
        return f"{self.name} {self.suffix}"


@dataclass
class _Invention:
    name: str
    device: str
    year: int = 0
    inventor: _Person | None = None
    demonstrated: _Town | None = None
    pid: str = ""

    @property
    def title(self) -> str:
        return f"{self.name} {self.device}"


@dataclass
class _World:
    people: list[_Person] = field(default_factory=list)
    towns: list[_Town] = field(default_factory=list)
    rivers: list[_River] = field(default_factory=list)
    mountains: list[_Mountain] = field(default_factory=list)
    companies: list[_Company] = field(default_factory=list)
    inventions: list[_Invention] = field(default_factory=list)

    def entities(self) -> list[Any]:
        return [*self.people, *self.towns, *self.rivers, *self.mountains, *self.companies, *self.inventions]


# shares of the passages per entity type (the rest are people)
_SHARES = {"towns": 0.15, "rivers": 0.08, "mountains": 0.08, "companies": 0.15, "inventions": 0.12}


def _build_world(rng: _Rng, num_passages: int) -> _World:
    names = _Names(rng)
    counts = {kind: max(4, round(num_passages * share)) for kind, share in _SHARES.items()}
    counts["people"] = num_passages - sum(counts.values())
    num_provinces = max(4, counts["towns"] // 12)
    provinces = [names.new((2, 3)) for _ in range(num_provinces)]
    seas = [names.new((2, 2)) + " Sea" for _ in range(max(3, counts["rivers"] // 15))]
    ranges = [names.new((2, 3)) + " Range" for _ in range(max(3, counts["mountains"] // 10))]
    world = _World()
    for _ in range(counts["mountains"]):
        world.mountains.append(_Mountain(names.new((2, 3)), rng.between(900, 4800), rng.choice(ranges)))
    for _ in range(counts["rivers"]):
        world.rivers.append(_River(names.new((2, 3)), rng.between(40, 1900), rng.choice(seas)))
    for _ in range(counts["towns"]):
        world.towns.append(_Town(names.new((2, 3)), rng.choice(provinces), rng.between(1100, 1780),
                                 rng.between(800, 250_000), rng.choice(SPECIALITIES)))
    for _ in range(counts["people"]):
        world.people.append(_Person(names.new((2, 2), 4, 8), names.new((2, 3), 5, 11), rng.choice(PRONOUNS),
                                    rng.between(1790, 1960), rng.choice(OCCUPATIONS)))
    for _ in range(counts["companies"]):
        world.companies.append(_Company(names.new((2, 3)), rng.choice(COMPANY_SUFFIXES), rng.choice(INDUSTRIES)))
    for _ in range(counts["inventions"]):
        world.inventions.append(_Invention(names.new((2, 3)), rng.choice(DEVICES)))

    # links; a mountain feeds at most two rivers and a river crosses at most four towns, so no
    # passage is drowned out by many others naming the same entity
    for i, river in enumerate(world.rivers):
        river.source = world.mountains[i % len(world.mountains)] if i < 2 * len(world.mountains) else rng.choice(world.mountains)
    for i, town in enumerate(world.towns):
        town.river = world.rivers[i % len(world.rivers)] if rng.chance(0.8) else rng.choice(world.rivers)
    for person in world.people:
        person.birthplace, person.residence = rng.choice(world.towns), rng.choice(world.towns)
        if person.residence is person.birthplace:
            person.residence = world.towns[(world.towns.index(person.birthplace) + 1) % len(world.towns)]
        if rng.chance(0.35):
            mentor = rng.choice(world.people)
            if mentor is not person and mentor.birth_year < person.birth_year - 10:
                person.mentor = mentor
    founders = rng.sample(world.people, len(world.companies) + len(world.inventions) + len(world.mountains))
    for company, founder in zip(world.companies, founders, strict=False):
        company.founder, company.hq = founder, rng.choice(world.towns)
        company.founded = min(founder.birth_year + rng.between(22, 55), 2015)
    for invention, inventor in zip(world.inventions, founders[len(world.companies):], strict=False):
        invention.inventor, invention.demonstrated = inventor, rng.choice(world.towns)
        invention.year = min(inventor.birth_year + rng.between(20, 60), 2015)
    for mountain, climber in zip(world.mountains, founders[len(world.companies) + len(world.inventions):], strict=False):
        mountain.climber = climber
        mountain.climbed = min(climber.birth_year + rng.between(18, 45), 2015)
    return world


# ---------------------------------------------------------------------------------------------
# passages: the entity's name appears in the title line and at least twice in the text, so its
# own passage outranks passages that mention it once


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def _person_text(p: _Person, rng: _Rng) -> str:
    he, his = p.pronoun
    sentences = [rng.choice((
        f"{p.title} was {_a(p.occupation)} born in {p.birth_year} in the town of {p.birthplace.name}.",
        f"{p.title} was born in {p.birth_year} in the town of {p.birthplace.name} and became {_a(p.occupation)}.",
    ))]
    sentences.append(rng.choice((
        f"{p.last} later settled in {p.residence.name}, where {he} spent most of {his} working life.",
        f"In later life {p.last} settled in {p.residence.name}.",
    )))
    if p.mentor is not None:
        sentences.append(f"{he.capitalize()} studied under {p.mentor.title}.")
    sentences.append(rng.choice((
        f"{p.last} is remembered for {his} careful notebooks.",
        f"Letters written by {p.last} survive in a private collection.",
        f"{p.last} travelled widely as a young {p.occupation}.",
    )))
    return " ".join(sentences)


def _town_text(t: _Town, rng: _Rng) -> str:
    return " ".join((
        f"{t.name} is a town in the province of {t.province}, on the {t.river.title}.",
        rng.choice((f"The settlement of {t.name} was founded in {t.founded}.",
                    f"{t.name} was founded in {t.founded} as a small settlement.")),
        f"The population of {t.name} is {t.population:,}.",
        rng.choice((f"The town is known for {t.speciality}.", f"Visitors come to {t.name} for {t.speciality}.")),
    ))


def _river_text(r: _River, rng: _Rng) -> str:
    return " ".join((
        f"The {r.title} is {r.length_km:,} kilometres long.",
        f"The {r.name} rises on {r.source.title} and flows into the {r.sea}.",
        rng.choice((f"Barges once carried grain along the {r.name}.", f"The {r.name} freezes in hard winters.",
                    f"Eels are fished in the lower {r.name}.")),
    ))


def _mountain_text(m: _Mountain, rng: _Rng) -> str:
    return " ".join((
        f"{m.title} is a peak of the {m.range_name}, {m.height_m:,} metres high.",
        f"{m.title} was first climbed in {m.climbed} by {m.climber.title}.",
        rng.choice((f"Snow lies on {m.name} for most of the year.", f"Shepherds graze flocks below {m.name}.")),
    ))


def _company_text(c: _Company, rng: _Rng) -> str:
    return " ".join((
        f"{c.title} is {_a(c.industry)} company headquartered in {c.hq.name}.",
        rng.choice((f"{c.title} was founded in {c.founded} by {c.founder.title}.",
                    f"{c.founder.title} founded {c.title} in {c.founded}.")),
        rng.choice((f"{c.name} employs several hundred people.", f"{c.name} exports most of what it makes.")),
    ))


def _invention_text(v: _Invention, rng: _Rng) -> str:
    return " ".join((
        f"The {v.title} is {_a(v.device)} for {PURPOSES[v.device]}.",
        f"The {v.title} was invented by {v.inventor.title} in {v.year}.",
        f"The {v.name} {v.device} was first demonstrated in {v.demonstrated.name}.",
    ))


_TEXT = {_Person: _person_text, _Town: _town_text, _River: _river_text, _Mountain: _mountain_text,
         _Company: _company_text, _Invention: _invention_text}


# ---------------------------------------------------------------------------------------------
# questions: one fact each, as (question, golden answers, passage)


@dataclass(frozen=True)
class _Fact:
    question: str
    answers: tuple[str, ...]
    entity: Any


def _facts(e: Any) -> dict[str, _Fact]:
    """The single-hop questions about one entity, by attribute."""
    if isinstance(e, _Person):
        return {
            "birthplace": _Fact(f"In which town was {e.title} born?", (e.birthplace.name,), e),
            "birth_year": _Fact(f"In what year was {e.title} born?", (str(e.birth_year),), e),
            "residence": _Fact(f"In which town did {e.title} settle in later life?", (e.residence.name,), e),
        }
    if isinstance(e, _Town):
        return {
            "river": _Fact(f"Which river flows past the town of {e.name}?", (e.river.title, e.river.name), e),
            "province": _Fact(f"In which province is the town of {e.name}?", (e.province, f"{e.province} Province"), e),
            "founded": _Fact(f"In what year was the settlement of {e.name} founded?", (str(e.founded),), e),
            "population": _Fact(f"What is the population of {e.name}?", (f"{e.population:,}",), e),
        }
    if isinstance(e, _River):
        return {
            "length": _Fact(f"How long is the {e.title}?", (f"{e.length_km:,} kilometres", f"{e.length_km:,} km", f"{e.length_km:,}"), e),
            "source": _Fact(f"On which mountain does the {e.title} rise?", (e.source.title, e.source.name), e),
            "sea": _Fact(f"Into which sea does the {e.title} flow?", (e.sea, e.sea.removesuffix(" Sea")), e),
        }
    if isinstance(e, _Mountain):
        return {
            "height": _Fact(f"How high is {e.title}?", (f"{e.height_m:,} metres", f"{e.height_m:,} m", f"{e.height_m:,}"), e),
            "range": _Fact(f"Which mountain range is {e.title} part of?", (e.range_name, e.range_name.removesuffix(" Range")), e),
            "climber": _Fact(f"Who first climbed {e.title}?", (e.climber.title,), e),
        }
    if isinstance(e, _Company):
        return {
            "founder": _Fact(f"Who founded {e.title}?", (e.founder.title,), e),
            "hq": _Fact(f"In which town is {e.title} headquartered?", (e.hq.name,), e),
            "founded": _Fact(f"In what year was {e.title} founded?", (str(e.founded),), e),
        }
    if isinstance(e, _Invention):
        return {
            "inventor": _Fact(f"Who invented the {e.title}?", (e.inventor.title,), e),
            "year": _Fact(f"In what year was the {e.title} invented?", (str(e.year),), e),
            "demonstrated": _Fact(f"In which town was the {e.title} first demonstrated?", (e.demonstrated.name,), e),
        }
    raise TypeError(type(e))


@dataclass(frozen=True)
class _Question:
    question: str
    answers: tuple[str, ...]
    hops: tuple[_Fact, ...]
    kind: str


def _bridges(world: _World) -> Iterator[_Question]:
    """Two-hop questions: the first hop names an entity whose passage holds the answer."""
    for c in world.companies:
        f = c.founder
        yield _Question(f"In which town was the founder of {c.title} born?", (f.birthplace.name,),
                        (_facts(c)["founder"], _facts(f)["birthplace"]), "bridge")
        yield _Question(f"In what year was the founder of {c.title} born?", (str(f.birth_year),),
                        (_facts(c)["founder"], _facts(f)["birth_year"]), "bridge")
        yield _Question(f"Which river flows past the town where {c.title} is headquartered?",
                        (c.hq.river.title, c.hq.river.name), (_facts(c)["hq"], _facts(c.hq)["river"]), "bridge")
        yield _Question(f"In which province is the town where {c.title} is headquartered?",
                        (c.hq.province, f"{c.hq.province} Province"), (_facts(c)["hq"], _facts(c.hq)["province"]), "bridge")
    for v in world.inventions:
        yield _Question(f"In which town was the inventor of the {v.title} born?", (v.inventor.birthplace.name,),
                        (_facts(v)["inventor"], _facts(v.inventor)["birthplace"]), "bridge")
        yield _Question(f"In what year was the inventor of the {v.title} born?", (str(v.inventor.birth_year),),
                        (_facts(v)["inventor"], _facts(v.inventor)["birth_year"]), "bridge")
    for p in world.people:
        yield _Question(f"Which river flows past the town where {p.title} was born?",
                        (p.birthplace.river.title, p.birthplace.river.name),
                        (_facts(p)["birthplace"], _facts(p.birthplace)["river"]), "bridge")
    for t in world.towns:
        r = t.river
        yield _Question(f"Into which sea does the river that flows past {t.name} flow?", (r.sea, r.sea.removesuffix(" Sea")),
                        (_facts(t)["river"], _facts(r)["sea"]), "bridge")
        yield _Question(f"On which mountain does the river that flows past {t.name} rise?", (r.source.title, r.source.name),
                        (_facts(t)["river"], _facts(r)["source"]), "bridge")
    for m in world.mountains:
        yield _Question(f"In which town was the first person to climb {m.title} born?", (m.climber.birthplace.name,),
                        (_facts(m)["climber"], _facts(m.climber)["birthplace"]), "bridge")


def _comparisons(world: _World, rng: _Rng, count: int) -> Iterator[_Question]:
    """Which of two entities has the larger/earlier value of one fact (never a tie)."""
    specs = (
        (world.companies, "founded", lambda c: c.founded, "Which company was founded earlier, {a} or {b}?", min),
        (world.people, "birth_year", lambda p: p.birth_year, "Who was born earlier, {a} or {b}?", min),
        (world.rivers, "length", lambda r: r.length_km, "Which river is longer, the {a} or the {b}?", max),
        (world.mountains, "height", lambda m: m.height_m, "Which mountain is higher, {a} or {b}?", max),
    )
    seen: set[frozenset[str]] = set()
    made = 0
    for _ in range(count * 20):
        if made >= count:
            break
        items, attr, value, template, pick = rng.choice(specs)
        a, b = rng.choice(items), rng.choice(items)
        key = frozenset((a.title, b.title))
        if a is b or value(a) == value(b) or key in seen:
            continue
        seen.add(key)
        winner = pick((a, b), key=value)
        answers = (winner.title, winner.name) if isinstance(winner, (_River, _Mountain)) else (winner.title,)
        made += 1
        yield _Question(template.format(a=a.title, b=b.title), answers, (_facts(a)[attr], _facts(b)[attr]), "comparison")


# ---------------------------------------------------------------------------------------------
# the files


@dataclass(frozen=True)
class GeneratedCorpus:
    """The records of one generated corpus, ready to write."""

    corpus: list[dict[str, str]]
    splits: dict[str, list[dict[str, Any]]]
    meta: dict[str, Any]


def contents_of(title: str, text: str) -> str:
    """The Search-R1/FlashRAG ``contents`` field: the quoted title, a newline, the text."""
    return f'"{title}"\n{text}'


def generate(seed: int = 0, num_passages: int = DEFAULT_NUM_PASSAGES) -> GeneratedCorpus:
    """Build the corpus and both QA splits in memory (deterministic in ``seed`` and ``num_passages``)."""
    _check_args(seed, num_passages)
    rng = _Rng(seed)
    world = _build_world(rng, num_passages)
    entities = world.entities()
    rng.shuffle(entities)
    width = max(6, len(str(len(entities))))
    corpus = []
    for i, entity in enumerate(entities):
        entity.pid = f"p{i:0{width}d}"
    for entity in entities:
        text = _TEXT[type(entity)](entity, rng)
        corpus.append({"id": entity.pid, "title": entity.title, "contents": contents_of(entity.title, text)})

    singles = [_Question(f.question, f.answers, (f,), "single") for e in entities for f in _facts(e).values()]
    bridges = list(_bridges(world))
    comparisons = list(_comparisons(world, rng, count=max(10, len(bridges) // 5)))
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "eval": []}
    seen: set[str] = set()
    counter = 0
    for group in (singles, bridges, comparisons):
        rng.shuffle(group)
        unique = []
        for q in group:
            if q.question not in seen:
                seen.add(q.question)
                unique.append(q)
        n_eval = max(1, round(len(unique) * EVAL_FRACTION))
        for split, questions in (("eval", unique[:n_eval]), ("train", unique[n_eval:])):
            for q in questions:
                counter += 1
                splits[split].append({
                    "id": f"q{counter:07d}",
                    "question": q.question,
                    "golden_answers": list(q.answers),
                    "supporting_ids": [hop.entity.pid for hop in q.hops],
                    "type": "single" if q.kind == "single" else "multi",
                    "kind": q.kind,
                    "hop_queries": [hop.question for hop in q.hops],
                })
    for records in splits.values():
        rng.shuffle(records)  # mix single and multi-hop questions within a split
    meta = {
        "generator_version": GENERATOR_VERSION, "seed": seed, "num_passages": len(corpus),
        "num_questions": {split: len(records) for split, records in splits.items()},
        "contents_format": '"Title"\\nText',
    }
    return GeneratedCorpus(corpus, splits, meta)


def _check_args(seed: int, num_passages: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"corpus seed must be a non-negative integer, got {seed!r}.")
    if isinstance(num_passages, bool) or not isinstance(num_passages, int) or not MIN_PASSAGES <= num_passages <= MAX_PASSAGES:
        raise ConfigError(
            f"num_passages must be an integer from {MIN_PASSAGES} to {MAX_PASSAGES}, got {num_passages!r}."
        )


def _jsonl_bytes(records: Iterable[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")


def _write_files(folder: Path, generated: GeneratedCorpus) -> None:
    payloads = {CORPUS_FILE: _jsonl_bytes(generated.corpus)}
    for split in SPLITS:
        payloads[f"{split}.jsonl"] = _jsonl_bytes(generated.splits[split])
    meta = {**generated.meta, "sha256": {name: hashlib.sha256(data).hexdigest() for name, data in payloads.items()}}
    payloads[META_FILE] = (json.dumps(meta, indent=1, sort_keys=True) + "\n").encode("utf-8")
    for name, data in payloads.items():
        (folder / name).write_bytes(data)


def write_corpus(path: str | os.PathLike, *, seed: int = 0, num_passages: int = DEFAULT_NUM_PASSAGES,
                 overwrite: bool = False) -> Path:
    """Write ``corpus.jsonl``, ``train.jsonl``, ``eval.jsonl`` and ``meta.json`` into folder ``path``.

    Returns the folder. Refuses to replace existing files unless ``overwrite``.
    """
    folder = Path(path).expanduser()
    _check_args(seed, num_passages)
    existing = [n for n in (CORPUS_FILE, TRAIN_FILE, EVAL_FILE, META_FILE) if (folder / n).exists()]
    if existing and not overwrite:
        raise ConfigError(f"{folder} already holds {existing}; pass overwrite=True to replace them, or choose another folder.")
    folder.mkdir(parents=True, exist_ok=True)
    _write_files(folder, generate(seed, num_passages))
    return folder


def generated_dir(seed: int = 0, num_passages: int = DEFAULT_NUM_PASSAGES) -> Path:
    """The cache folder of one generated corpus, created (atomically) on first use."""
    _check_args(seed, num_passages)
    root = cache_dir() / "search_qa"
    folder = root / f"seed{seed}-n{num_passages}-v{GENERATOR_VERSION}"
    if (folder / META_FILE).exists():
        return folder
    with build_folder_once(folder, META_FILE) as tmp:
        _write_files(tmp, generate(seed, num_passages))
    return folder


# ---------------------------------------------------------------------------------------------
# reading


@dataclass(frozen=True)
class QAItem:
    """One question of a QA file."""

    id: str
    question: str
    golden_answers: tuple[str, ...]
    supporting_ids: tuple[str, ...] = ()
    type: str = "single"
    kind: str = "single"
    hop_queries: tuple[str, ...] = ()


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        handle = path.open(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"Cannot read {path}: {err}") from err
    with handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ConfigError(f"{path}:{lineno} is not valid JSON ({err.msg}).") from err
            if not isinstance(record, dict):
                raise ConfigError(f"{path}:{lineno} must be a JSON object, got {type(record).__name__}.")
            yield lineno, record


def read_qa(path: str | os.PathLike) -> list[QAItem]:
    """Questions from an NQ/HotpotQA-style JSONL file (``question`` and ``golden_answers`` required)."""
    path = Path(path)
    items = []
    for lineno, r in _read_jsonl(path):
        question, answers = r.get("question"), r.get("golden_answers")
        if isinstance(answers, str):
            answers = [answers]
        if not isinstance(question, str) or not question.strip():
            raise ConfigError(f"{path}:{lineno} needs a non-empty string 'question'.")
        if not (isinstance(answers, list) and answers and all(isinstance(a, str) for a in answers)):
            raise ConfigError(f"{path}:{lineno} needs 'golden_answers', a non-empty list of strings.")
        supporting = r.get("supporting_ids") or []
        hops = r.get("hop_queries") or []
        items.append(QAItem(
            id=str(r.get("id", f"{path.stem}-{lineno}")), question=question, golden_answers=tuple(answers),
            supporting_ids=tuple(str(s) for s in supporting), type=str(r.get("type", "single")),
            kind=str(r.get("kind", r.get("type", "single"))), hop_queries=tuple(str(h) for h in hops),
        ))
    if not items:
        raise ConfigError(f"{path} holds no questions.")
    return items


def split_title(contents: str) -> tuple[str, str]:
    """Split Search-R1 ``contents`` into (title, text): the first line, unquoted, and the rest."""
    first, _, rest = contents.partition("\n")
    return first.strip().strip('"'), rest


def read_corpus_records(path: str | os.PathLike) -> Iterator[tuple[str, str, str]]:
    """Yield (id, title, text) from a corpus JSONL file.

    Each line needs ``id`` and either ``contents`` (``'"Title"\\nText'``; an explicit ``title``
    field wins over the first line) or ``title`` and ``text``.
    """
    path = Path(path)
    for lineno, r in _read_jsonl(path):
        doc_id = r.get("id")
        if not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool):
            raise ConfigError(f"{path}:{lineno} needs an 'id' (string or integer).")
        if isinstance(r.get("contents"), str):
            title, text = split_title(r["contents"])
            if isinstance(r.get("title"), str):
                title = r["title"]
        elif isinstance(r.get("text"), str):
            title, text = str(r.get("title", "")), r["text"]
        else:
            raise ConfigError(f"{path}:{lineno} needs 'contents' (or 'title' and 'text').")
        yield str(doc_id), title, text
