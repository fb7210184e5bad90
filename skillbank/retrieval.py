"""Skill retrievers (entry-point group ``agentkit.retrievers``): ucb, keyword, full, random.

A retriever is any object with ``retrieve(bank, task, k, *, env, task_type, rng) -> list[Skill]``.
``rng`` is a ``random.Random`` seeded per episode by the caller, so a run is reproducible and a
resumed run retrieves what the uninterrupted run would have. Statistics are updated by the
caller through ``SkillBank.record_episode`` after each episode; the training loop credits each
episode's skills with the episode's return when the policy sees them, and otherwise with a reward
in [0, 1] that says whether the teacher holding them endorsed the student's actions in won
episodes and disfavoured them in lost ones (``agentkit.train.skill_credit``).
"""

from __future__ import annotations

import inspect
import math
import random
import re
from collections import Counter
from typing import Any, ClassVar, Protocol, runtime_checkable

from agentkit.skillbank.bank import Skill, SkillBank, resolve_bank
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentkit.core.errors import ConfigError, PluginError
from agentkit.core.plugins import PluginRegistry, PluginSpec
from agentkit.core.settings import SkillSettings

_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset("a an the to of in on at and or is are be it you your this that with for from into".split())


def words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP]


@runtime_checkable
class Retriever(Protocol):
    """A retriever plugin (entry-point group ``agentkit.retrievers``): a class whose ``Config`` (a
    pydantic model, its settings from ``skills.args``) it is built with, and ``retrieve``."""

    Config: ClassVar[type[BaseModel]]

    def retrieve(self, bank: SkillBank, task: str, k: int, *, env: str | None = None, task_type: str | None = None,
                 rng: random.Random | None = None) -> list[Skill]:
        ...


class UCBConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    c: float = Field(1.0, ge=0, description="Exploration weight: mean reward + c * sqrt(ln N / n).")


class UCB:
    """A bandit over skills: mean reward of the episodes that used the skill + c sqrt(ln N / n).

    Untried skills come first; ties (e.g. among untried skills) are broken by ``rng``, so the
    episodes of one step explore different untried skills.
    """

    Config = UCBConfig

    def __init__(self, config: UCBConfig | None = None) -> None:
        self.config = config or UCBConfig()

    def score(self, skill: Skill, total: int) -> float:
        n = skill.stats.uses
        if n == 0:
            return math.inf
        return skill.stats.mean_reward + self.config.c * math.sqrt(math.log(max(total, 1)) / n)

    def retrieve(self, bank, task, k, *, env=None, task_type=None, rng=None):
        candidates = bank.for_env(env, task_type)
        total = sum(s.stats.uses for s in candidates) or bank.episodes
        rng = rng or random.Random(0)
        ties = {s.id: rng.random() for s in candidates}
        ranked = sorted(candidates, key=lambda s: (-self.score(s, total), ties[s.id]))
        return ranked[:k]


class KeywordConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    method: str = Field("bm25", pattern="^(bm25|overlap)$", description="bm25 (over skill text and keywords) or overlap.")
    k1: float = Field(1.2, gt=0, description="BM25 k1.")
    b: float = Field(0.75, ge=0, le=1, description="BM25 b.")


class Keyword:
    """Rank skills by BM25 (or plain keyword overlap) between the task text and each skill's
    keywords, title and text. Keywords count twice. Skills with score 0 are never returned."""

    Config = KeywordConfig

    def __init__(self, config: KeywordConfig | None = None) -> None:
        self.config = config or KeywordConfig()

    @staticmethod
    def _doc(skill: Skill) -> list[str]:
        return words(" ".join(skill.keywords)) * 2 + words(skill.title + " " + skill.text)

    def scores(self, skills: list[Skill], task: str) -> list[float]:
        query = set(words(task))
        docs = [self._doc(s) for s in skills]
        if self.config.method == "overlap":
            return [float(len(query & set(d))) for d in docs]
        n = len(docs)
        avg = sum(len(d) for d in docs) / max(n, 1)
        df = Counter(w for d in docs for w in set(d))
        out = []
        for d in docs:
            tf = Counter(d)
            s = 0.0
            for w in query:
                if tf[w]:
                    idf = math.log(1 + (n - df[w] + 0.5) / (df[w] + 0.5))
                    s += idf * tf[w] * (self.config.k1 + 1) / (
                        tf[w] + self.config.k1 * (1 - self.config.b + self.config.b * len(d) / max(avg, 1e-9)))
            out.append(s)
        return out

    def retrieve(self, bank, task, k, *, env=None, task_type=None, rng=None):
        candidates = bank.for_env(env, task_type)
        scored = [(s, sc) for s, sc in zip(candidates, self.scores(candidates, task), strict=True) if sc > 0]
        scored.sort(key=lambda pair: -pair[1])  # stable: bank order breaks ties
        return [s for s, _ in scored[:k]]


class FullConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_chars: int = Field(4000, gt=0, description="Budget for the rendered skills (about 4 characters per token).")


class Full:
    """Every applicable skill in bank order, until the budget is spent (``k`` is ignored)."""

    Config = FullConfig

    def __init__(self, config: FullConfig | None = None) -> None:
        self.config = config or FullConfig()

    def retrieve(self, bank, task, k, *, env=None, task_type=None, rng=None):
        chosen, used = [], 0
        for skill in bank.for_env(env, task_type):
            size = len(skill.render()) + 1
            if used + size > self.config.max_chars:
                break
            chosen.append(skill)
            used += size
        return chosen


class RandomConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Random:
    """k applicable skills drawn with the episode's seeded ``rng``."""

    Config = RandomConfig

    def __init__(self, config: RandomConfig | None = None) -> None:
        self.config = config or RandomConfig()

    def retrieve(self, bank, task, k, *, env=None, task_type=None, rng=None):
        candidates = bank.for_env(env, task_type)
        return (rng or random.Random(0)).sample(candidates, min(k, len(candidates)))


REGISTRY = PluginRegistry("agentkit.retrievers", "retriever")
for _name, _target, _about in [
    ("ucb", "agentkit.skillbank.retrieval:UCB", "bandit: mean reward + c sqrt(ln N / n), untried first"),
    ("keyword", "agentkit.skillbank.retrieval:Keyword", "BM25 or keyword overlap with the task text"),
    ("full", "agentkit.skillbank.retrieval:Full", "every applicable skill within a character budget"),
    ("random", "agentkit.skillbank.retrieval:Random", "k skills at random (seeded per episode)"),
]:
    REGISTRY.register(PluginSpec(_name, _target, description=_about))


def make_retriever(name: str, args: dict[str, Any] | None = None) -> Retriever:
    spec, cls = REGISTRY.load(name)
    config_cls = inspect.getattr_static(cls, "Config", None) if isinstance(cls, type) else None
    if not (isinstance(config_cls, type) and issubclass(config_cls, BaseModel)):
        raise PluginError(f"Retriever {name!r} from {spec.distribution!r} (group {REGISTRY.group!r}) resolved to "
                          f"{cls!r}, which is not a class with a pydantic `Config`; a retriever is a class built "
                          "from its Config with a retrieve(bank, task, k, *, env, task_type, rng) method.")
    try:
        return cls(config_cls(**(args or {})))
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors())
        raise ConfigError(f"Invalid settings for retriever {name!r}: {problems}. "
                          f"Its settings are {sorted(config_cls.model_fields)}.") from err


class SkillSelector:
    """Picks each episode's skills for the collector: ``selector(spec, task, info) -> (ids, text)``.

    Args:
        bank: the skill bank (its statistics as of now are used; update them after the step).
        retriever: a retriever (``make_retriever``).
        k: skills per episode.
        env_id: filters skills by ``applies_to`` (with the episode's ``info['task_type']``).
        seed: with the episode's task seed and sample, seeds the retriever's ``rng``.
        show_policy: also put the skills in the policy's prompt (skill-conditioned policies);
            otherwise ``text`` is None and only a teacher sees them.
    """

    def __init__(self, bank: SkillBank, retriever: Retriever, k: int, *, env_id: str, seed: int = 0,
                 show_policy: bool = False) -> None:
        self.bank, self.retriever, self.k = bank, retriever, k
        self.env_id, self.seed, self.show_policy = env_id, seed, show_policy

    def __call__(self, spec, task: str, info: dict[str, Any]) -> tuple[list[str], str | None]:
        from agentkit.skillbank.bank import render_skills

        rng = random.Random(f"{self.seed}|{spec.seed}|{spec.sample}")
        chosen = self.retriever.retrieve(self.bank, task, self.k, env=self.env_id, task_type=info.get("task_type"),
                                         rng=rng)
        text = render_skills(chosen, "[Skills]") if self.show_policy and chosen else None
        return [s.id for s in chosen], text


def make_selector(bank: SkillBank, settings: SkillSettings, *, env_id: str, seed: int, show_policy: bool,
                  retriever: Retriever | None = None) -> SkillSelector:
    """The one way a ``SkillSelector`` is built from the skill settings: ``settings.k`` skills from
    ``bank`` by ``retriever`` (default: a new one of ``settings.retrieval`` with ``settings.args``)."""
    if retriever is None:
        retriever = make_retriever(settings.retrieval, settings.args)
    return SkillSelector(bank, retriever, settings.k, env_id=env_id, seed=seed, show_policy=show_policy)


def policy_selector(settings: SkillSettings, *, env_id: str, seed: int) -> SkillSelector | None:
    """The selector whose skills a policy sees in its prompt (``rollout``/``eval`` with ``--skills``),
    or None when no bank is given."""
    if not settings.bank:
        return None
    return make_selector(SkillBank.load(resolve_bank(settings.bank)), settings, env_id=env_id, seed=seed,
                         show_policy=True)
