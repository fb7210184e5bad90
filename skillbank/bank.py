"""Skills and skill banks: a JSON or YAML file a person can read and edit, with usage statistics.

A bank file is a mapping ``{"skills": [ {id, title, text, keywords, applies_to, stats}, ... ],
"episodes": N}``. ``applies_to`` lists environment ids, families (``textworld``) or task types
(``alfworld:pick_and_place``); an empty list means "anywhere". ``stats`` (uses, reward_sum) are
what UCB retrieval learns from; they are written back with the bank, atomically, so an edit the
user made by hand and the learned statistics live in the same file. The reward is what the
caller credits a skill's episodes with (in training, ``agentkit.train.skill_credit``: the return only
when the policy sees the skills). Banks that name the sum ``return_sum``, as agentkit wrote it
before, load as they are.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentkit.core.config import load_yaml
from agentkit.core.errors import AgentkitError, ConfigError, UnknownNameError, did_you_mean


class SkillBankError(AgentkitError, ValueError):
    """A bank file that cannot be read or has bad fields."""


class SkillStats(BaseModel):
    model_config = ConfigDict(extra="forbid")

    uses: int = Field(0, ge=0, description="Episodes that used the skill.")
    # `return_sum` is its name in banks written before the credit was more than the return
    reward_sum: float = Field(0.0, validation_alias=AliasChoices("reward_sum", "return_sum"),
                              description="Sum of the rewards those episodes credited it with.")

    @property
    def mean_reward(self) -> float:
        return self.reward_sum / self.uses if self.uses else 0.0


class Skill(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(..., min_length=1, description="Unique id within the bank.")
    title: str = Field(..., min_length=1, description="One line.")
    text: str = Field(..., min_length=1, description="The guidance itself, shown to the model.")
    keywords: list[str] = Field(default_factory=list, description="Words that make the skill relevant to a task.")
    applies_to: list[str] = Field(default_factory=list, description="Env ids, families or task types; empty = all.")
    stats: SkillStats = Field(default_factory=SkillStats)
    source: str = Field("written", description="'written' by a person, or where it was extracted from.")

    @field_validator("id")
    @classmethod
    def _id_is_a_name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.:-]+", value):
            raise ValueError(f"skill id {value!r} may hold only letters, digits and _.:- (it is recorded in trajectories)")
        return value

    def applies(self, env: str | None, task_type: str | None = None) -> bool:
        if not self.applies_to or env is None:
            return True
        family = env.split("/")[0]
        targets = {env, family} | ({task_type, f"{family}:{task_type}"} if task_type else set())
        # with the task type unknown, a skill for any task type of the family applies
        return any(a in targets or (task_type is None and a.startswith(f"{family}:")) for a in self.applies_to)

    def render(self) -> str:
        return f"- {self.title}: {self.text}"


class SkillBank:
    """An ordered collection of skills, loaded from and saved to one file."""

    def __init__(self, skills: Iterable[Skill] = (), *, episodes: int = 0, path: str | Path | None = None) -> None:
        self.skills: list[Skill] = []
        self._by_id: dict[str, Skill] = {}
        self.episodes = episodes
        self.path = Path(path) if path is not None else None
        for skill in skills:
            self.add(skill)

    # -- files ---------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> SkillBank:
        """Read a bank file; any problem is a SkillBankError naming the file, the skill and (for YAML)
        the line. Loading never writes."""
        path = Path(path)
        if not path.exists():
            raise SkillBankError(f"Skill bank {path} does not exist. Starter banks: {', '.join(starter_banks())} "
                                 "(pass a name, or a file path).")
        text, data = _read_bank_file(path)
        where = _Locator(path, text)
        listed = isinstance(data, list)  # the file is the list of skills itself
        if listed:
            data = {"skills": data}
        if not isinstance(data, dict) or not isinstance(data.get("skills"), list):
            raise SkillBankError(f"Skill bank {path} must be a mapping with a 'skills' list (or a list of skills).")
        unknown = sorted(set(data) - {"skills", "episodes"}, key=str)
        if unknown:
            raise SkillBankError(f"Skill bank {path}: unknown top-level keys {unknown}{where.at(unknown[0])}; "
                                 "expected 'skills' and 'episodes'.")
        episodes = data.get("episodes", 0)
        if episodes is None:
            episodes = 0
        if type(episodes) is not int or episodes < 0:
            raise SkillBankError(f"Skill bank {path}: 'episodes' must be a non-negative integer (episodes recorded), "
                                 f"got {episodes!r}{where.at('episodes')}.")
        bank = cls(path=path, episodes=episodes)
        for i, record in enumerate(data["skills"]):
            item = (i,) if listed else ("skills", i)
            rid = record.get("id") if isinstance(record, dict) else None
            label = f"Skill bank {path}, skill #{i + 1}{f' ({rid!r})' if isinstance(rid, str) and rid else ''}"
            try:
                skill = Skill.model_validate(record)
            except ValidationError as err:
                problems = "; ".join(
                    f"{'.'.join(str(p) for p in e['loc']) or 'the skill'}: {e['msg']}{where.at(*item, *e['loc'])}"
                    for e in err.errors())
                raise SkillBankError(f"{label}: {problems}. Fields: {sorted(Skill.model_fields)}.") from err
            if skill.id in bank._by_id:
                raise SkillBankError(f"{label}: id {skill.id!r} appears twice{where.at(*item, 'id')}; ids must be unique.")
            bank.add(skill)
        return bank

    def to_dict(self) -> dict[str, Any]:
        return {"episodes": self.episodes, "skills": [s.model_dump() for s in self.skills]}

    def save(self, path: str | Path | None = None) -> Path:
        """Write atomically (a crash leaves the old file or the new one, never half of one)."""
        path = Path(path) if path is not None else self.path
        if path is None:
            raise SkillBankError("This bank was not loaded from a file; pass a path to save it.")
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self.to_dict()
        text = json.dumps(data, indent=1, ensure_ascii=False) if path.suffix == ".json" else \
            yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self.path = path
        return path

    # -- contents ------------------------------------------------------------------------------
    def add(self, skill: Skill) -> None:
        if skill.id in self._by_id:
            raise SkillBankError(f"skill id {skill.id!r} is already in the bank.")
        self.skills.append(skill)
        self._by_id[skill.id] = skill

    def __len__(self) -> int:
        return len(self.skills)

    def __iter__(self):
        return iter(self.skills)

    def get(self, skill_id: str) -> Skill:
        if skill_id not in self._by_id:
            raise UnknownNameError(f"No skill {skill_id!r} in the bank.{did_you_mean(skill_id, self._by_id)}")
        return self._by_id[skill_id]

    def for_env(self, env: str | None, task_type: str | None = None) -> list[Skill]:
        return [s for s in self.skills if s.applies(env, task_type)]

    def record_episode(self, skill_ids: Sequence[str], reward: float) -> None:
        """Count one finished episode: the skills it used get ``reward`` (UCB's statistics)."""
        self.episodes += 1
        for skill_id in skill_ids:
            if skill_id in self._by_id:  # a skill deleted by hand since: nothing to credit
                stats = self._by_id[skill_id].stats
                stats.uses += 1
                stats.reward_sum += float(reward)

    def copy(self) -> SkillBank:
        return SkillBank([s.model_copy(deep=True) for s in self.skills], episodes=self.episodes, path=self.path)


def _read_bank_file(path: Path) -> tuple[str, Any]:
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as err:
        raise SkillBankError(f"Cannot read skill bank {path}: {err.strerror or err}.") from err
    except UnicodeDecodeError as err:
        raise SkillBankError(f"Cannot read skill bank {path}: not UTF-8 text (byte offset {err.start}); save it as UTF-8.") from err
    if path.suffix == ".json":
        try:
            return text, json.loads(text)
        except json.JSONDecodeError as err:
            raise SkillBankError(f"Cannot read skill bank {path}:{err.lineno}:{err.colno}: not valid JSON ({err.msg}).") from err
        except (ValueError, RecursionError) as err:  # a number too long to convert, nesting too deep
            raise SkillBankError(f"Cannot read skill bank {path}: {err}") from err
    try:
        return text, load_yaml(text, where=str(path))
    except ConfigError as err:
        raise SkillBankError(f"Cannot read skill bank {err}") from err


class _Locator:
    """Lines of a YAML bank's nodes, looked up only when there is an error to report."""

    def __init__(self, path: Path, text: str) -> None:
        self.path, self.text = path, text
        self._root: Any = False  # not composed yet

    def _node(self) -> Any:
        if self._root is False:
            self._root = None
            if self.path.suffix != ".json":
                try:
                    self._root = yaml.compose(self.text, Loader=yaml.SafeLoader)
                except (yaml.YAMLError, RecursionError):
                    pass
        return self._root

    def at(self, *keys: Any) -> str:
        """`` (line N)`` for the deepest node on the path of mapping keys and list indexes, or ''."""
        node = self._node()
        line = None
        for key in keys:
            if isinstance(node, yaml.MappingNode):
                node = next((v for k, v in node.value if getattr(k, "value", None) == str(key)), None)
            elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and 0 <= key < len(node.value):
                node = node.value[key]
            else:
                break
            if node is None:
                break
            line = node.start_mark.line + 1
        return f" (line {line})" if line else ""


def render_skills(skills: Sequence[Skill], header: str = "[Privileged Skill Information]") -> str:
    """The labelled block a teacher (or a skill-conditioned policy) sees."""
    return header + "\n" + "\n".join(s.render() for s in skills)


BANKS_DIR = Path(__file__).parent / "banks"


def starter_banks() -> list[str]:
    return sorted(p.stem for p in BANKS_DIR.glob("*.yaml"))


def resolve_bank(name_or_path: str) -> Path:
    """A starter bank's name (``textworld``) or a file path."""
    path = Path(name_or_path)
    if path.exists() or path.suffix in (".json", ".yaml", ".yml") or os.sep in name_or_path:
        return path
    if name_or_path in starter_banks():
        return BANKS_DIR / f"{name_or_path}.yaml"
    raise ConfigError(f"No skill bank {name_or_path!r}: not a file, and not a starter bank.{did_you_mean(name_or_path, starter_banks())} "
                      f"Starter banks: {', '.join(starter_banks())}.")


def default_bank_for(env_id: str) -> str | None:
    family = env_id.split("/")[0].replace("-", "_")
    return family if family in starter_banks() else None
