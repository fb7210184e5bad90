"""Turn-segmented trajectories: the one record every part of agentkit reads and writes.

A trajectory keeps, per turn, the exact token ids that entered the model's context that turn
(``context_ids``) and the exact ids it sampled (``response_ids``) with their sampling logprobs.
In ``chat`` context mode the model's input at turn t is the concatenation of every earlier turn's
``context_ids + response_ids`` plus this turn's ``context_ids``; in ``window`` mode each turn's
``context_ids`` is a complete fresh prompt. Either way training rebuilds exactly what was sampled,
with no re-tokenization, and storage grows linearly with episode length.
"""

from __future__ import annotations

import json
import math
import types
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from agentkit.core.errors import TrajectoryFormatError

SCHEMA_VERSION = 1
ContextMode = Literal["chat", "window"]
# whether a context mode's turns form one growing token sequence (chat: turn t's input is every
# earlier turn's context + response) or each turn is a prompt of its own (window)
ONE_SEQUENCE: dict[str, bool] = {"chat": True, "window": False}

# The dataclasses below are the schema: a field's type and default say what a record may hold and
# whether it may be left out (``_schema``). Field metadata says the rest of how it is stored:
JSON_KEY = "json_key"  # its key in files, when not its name (written last, as files always had it)
REQUIRED = "required"  # required in files even though the constructor has a default
OMIT_NONE = "omit_none"  # written only when not None


@dataclass(frozen=True)
class Turn:
    """One agent turn.

    Attributes:
        observation: the (cleaned) environment text the agent answered.
        context_ids: token ids new to the model's context this turn (chat mode), or the whole
            prompt (window mode).
        response_ids: the sampled token ids, exactly as sampled.
        response_logprobs: logprob of each sampled id under the distribution it was sampled from.
        response_text: ``response_ids`` decoded.
        action: the action parsed from the response; None when none could be parsed.
        action_valid: the environment executed the action (False for malformed or unknown actions).
        reward: this step's reward (a difference, never cumulative).
        feedback: the environment's answer to the action (the next observation).
        finish_reason: "stop" (stop token or string) or "length" (hit max_new_tokens).
        generation_s: seconds the batched generate call that produced this turn took.
        env_s: seconds the environment step took.
        error: an error raised while stepping (the episode then ends truncated), else None.
        expert_action: the environment's expert action for this turn's state (its plan's next
            step), when it has one; judges and viewers compare the agent's action with it.
        action_read: the action as the environment read it, in its expert's wording
            (``info['action_read']``: ``go star`` for ``take the star exit``); None when it reports
            none. Written only when set.
        privileged: the environment's privileged text for this turn's state (``info["privileged"]``
            of the observation the turn answered: an expert plan from here, replanned after every
            step where the environment can); None when it gave none (a teacher then shows the
            episode's ``Trajectory.privileged``). Written only when set.
        policy_version: the version of the weights that sampled this turn (the trainer's updates
            made when they were sent to the sampler); in async training an episode may go on with
            newer weights at a turn boundary. None outside training. Written only when set.
    """

    observation: str
    context_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float]
    response_text: str
    action: str | None
    action_valid: bool
    reward: float
    feedback: str
    finish_reason: str = "stop"
    generation_s: float = 0.0
    env_s: float = 0.0
    error: str | None = None
    expert_action: str | None = None
    # files without per-turn privileged text stay readable by earlier versions
    privileged: str | None = field(default=None, metadata={OMIT_NONE: True})
    policy_version: int | None = field(default=None, metadata={OMIT_NONE: True})
    action_read: str | None = field(default=None, metadata={OMIT_NONE: True})


def episode_group(env: str, split: str, seed: int) -> str:
    """The id the episodes of one task share: ``env|split|seed``."""
    return f"{env}|{split}|{seed}"


def episode_id(env: str, split: str, seed: int, sample: int) -> str:
    """An episode's id: its task's group and its sample in the group, ``env|split|seed|sample``."""
    return f"{episode_group(env, split, seed)}|{sample}"


@dataclass(frozen=True)
class Trajectory:
    """One episode.

    Attributes:
        id: unique id, ``episode_id``: ``"{env}|{split}|{seed}|{sample}"``.
        env: environment id.
        task: the goal text.
        seed: the task seed (with ``split``, it fixes the task).
        split: "train" or "eval".
        group: id shared by the G samples of the same task (``episode_group``: ``"{env}|{split}|{seed}"``).
        sample: index within the group.
        turns: the turns in order.
        episode_return: sum of rewards (JSON key ``return``).
        won: the environment reported success.
        score: the environment's final score.
        terminated: the episode ended in the environment (won or lost).
        truncated: the episode was cut (turn limit, error).
        model: the policy's name or path.
        sampling: the sampling settings (temperature, top_p, max_new_tokens, ...).
        context_mode: "chat" or "window".
        privileged: text only a teacher may see (expert plan, gold answer), from reset (each turn's
            own is ``Turn.privileged``).
        error: why the episode was cut, if it was cut by an error.
        skills: ids of the skills retrieved for this episode (from the run's skill bank).
        skills_in_prompt: the policy itself saw those skills (skill-conditioned policies); else
            only a teacher did.
        created_at: UNIX time the record was written.
        task_type: the task's type when the environment names one (ALFWorld's six types,
            ScienceWorld's task); written only when set.
    """

    id: str
    env: str
    task: str
    seed: int
    split: str
    group: str
    sample: int
    turns: list[Turn]
    episode_return: float = field(metadata={JSON_KEY: "return"})
    won: bool
    score: float
    terminated: bool
    truncated: bool
    model: str
    sampling: dict[str, Any]
    context_mode: ContextMode = "chat"
    privileged: str | None = None
    error: str | None = None
    skills: list[str] = field(default_factory=list)
    skills_in_prompt: bool = False
    created_at: float = 0.0
    # every file says its version: required on read although the constructor fills it in
    schema_version: int = field(default=SCHEMA_VERSION, metadata={REQUIRED: True})
    # files without task types stay readable by earlier versions
    task_type: str | None = field(default=None, metadata={OMIT_NONE: True})

    @property
    def one_sequence(self) -> bool:
        """Its turns concatenate into the one sequence the model saw (``ONE_SEQUENCE``)."""
        return ONE_SEQUENCE[self.context_mode]

    @property
    def num_tokens(self) -> int:
        return sum(len(t.response_ids) for t in self.turns)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record. Shallow: its lists are the trajectory's own (``asdict`` deep-copies
        every token list, a tenth of a small model's training step)."""
        record = {f.name: getattr(self, f.name) for f in _TRAJECTORY.fields}
        record["turns"] = [_turn_record(t) for t in self.turns]
        record["sampling"] = dict(self.sampling)
        for name in _TRAJECTORY.omit_none:
            if record[name] is None:
                del record[name]
        for name, key in _TRAJECTORY.renamed.items():
            record[key] = record.pop(name)
        return record

    @classmethod
    def from_dict(cls, record: Any, *, where: str = "record") -> Trajectory:
        """Validate and build; every problem names ``where`` (file and line)."""
        return _trajectory_from_dict(record, where)


def _turn_record(turn: Turn) -> dict[str, Any]:
    record = {f.name: getattr(turn, f.name) for f in _TURN.fields}
    for name in _TURN.omit_none:
        if record[name] is None:
            del record[name]
    return record


def _allowed(hint: Any) -> tuple[type, ...]:
    """The JSON value types a field of type ``hint`` accepts (a float field takes integers too)."""
    if get_origin(hint) is Literal:
        return tuple(dict.fromkeys(type(value) for value in get_args(hint)))
    if get_origin(hint) in (Union, types.UnionType):
        return tuple(dict.fromkeys(t for arg in get_args(hint) for t in _allowed(arg)))
    if hint is float:
        return (int, float)
    return (get_origin(hint) or hint,)  # list[int] -> list, dict[str, Any] -> dict


def _has_default(f: Field) -> bool:
    return f.default is not MISSING or f.default_factory is not MISSING


@dataclass(frozen=True)
class _Schema:
    """How the records of one dataclass are checked and stored, read off its fields."""

    fields: tuple[Field, ...]
    types: dict[str, tuple[type, ...]]  # file key -> accepted JSON value types, in field order
    optional: frozenset[str]  # file keys a record may leave out
    choices: dict[str, tuple[Any, ...]]  # file key -> allowed values (Literal fields)
    renamed: dict[str, str]  # field name -> file key, where they differ
    omit_none: tuple[str, ...]  # fields written only when not None

    @classmethod
    def of(cls, datacls: type) -> _Schema:
        hints = get_type_hints(datacls)
        all_fields = fields(datacls)
        key = {f.name: f.metadata.get(JSON_KEY, f.name) for f in all_fields}
        return cls(
            fields=all_fields,
            types={key[f.name]: _allowed(hints[f.name]) for f in all_fields},
            optional=frozenset(key[f.name] for f in all_fields if _has_default(f) and not f.metadata.get(REQUIRED)),
            choices={key[f.name]: get_args(hints[f.name]) for f in all_fields if get_origin(hints[f.name]) is Literal},
            renamed={f.name: key[f.name] for f in all_fields if key[f.name] != f.name},
            omit_none=tuple(f.name for f in all_fields if f.metadata.get(OMIT_NONE)),
        )


_TURN = _Schema.of(Turn)
_TRAJECTORY = _Schema.of(Trajectory)


def _check_fields(record: dict, schema: _Schema, where: str) -> None:
    unknown = sorted(set(record) - set(schema.types))
    if unknown:
        raise TrajectoryFormatError(f"{where}: unknown field(s) {unknown}; expected only {sorted(schema.types)}.")
    for key, allowed in schema.types.items():
        if key not in record:
            if key in schema.optional:
                continue
            raise TrajectoryFormatError(f"{where}: missing required field {key!r}.")
        value = record[key]
        # bool is an int subclass: never accept it where a number is expected
        if isinstance(value, bool) and bool not in allowed:
            raise TrajectoryFormatError(f"{where}: field {key!r} is a bool; expected {_names(allowed)}.")
        if not isinstance(value, allowed):
            raise TrajectoryFormatError(
                f"{where}: field {key!r} has type {type(value).__name__}; expected {_names(allowed)}."
            )
        if float in allowed and not is_finite(value):
            raise TrajectoryFormatError(f"{where}: field {key!r} must be a finite number, got {_short(value)}.")
        if isinstance(value, str) and not is_unicode(value):
            raise TrajectoryFormatError(f"{where}: field {key!r} holds a lone surrogate (a \\ud800-\\udfff escape), "
                                        "which UTF-8 cannot encode; agentkit never writes one.")


def _names(types: tuple[type, ...]) -> str:
    return " or ".join("null" if t is type(None) else t.__name__ for t in types)


def is_finite(value: int | float) -> bool:
    # a JSON integer too large for a float (1e400 written out) is as unusable as Infinity
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def is_logprob(value: int | float) -> bool:
    """A logprob a trajectory may hold: finite and <= 0 (up to float noise)."""
    return is_finite(value) and value <= 1e-6


def is_unicode(text: str) -> bool:
    # json.loads turns a "\ud800" escape into a lone surrogate, which cannot be written back as UTF-8
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


MAX_TOKEN_ID = 2**31 - 1  # token ids become int32/int64 tensors; vocabularies are far smaller


def _turn_from_dict(record: Any, where: str) -> Turn:
    if not isinstance(record, dict):
        raise TrajectoryFormatError(f"{where}: a turn must be an object, got {type(record).__name__}.")
    _check_fields(record, _TURN, where)
    for key in ("context_ids", "response_ids"):
        if not all(type(i) is int and 0 <= i <= MAX_TOKEN_ID for i in record[key]):
            raise TrajectoryFormatError(f"{where}: {key!r} must be a list of non-negative integers up to {MAX_TOKEN_ID} (token ids).")
    logprobs = record["response_logprobs"]
    if len(logprobs) != len(record["response_ids"]):
        raise TrajectoryFormatError(
            f"{where}: {len(record['response_ids'])} response_ids but {len(logprobs)} response_logprobs."
        )
    if not all(type(x) in (int, float) and is_logprob(x) for x in logprobs):
        raise TrajectoryFormatError(f"{where}: response_logprobs must be finite numbers <= 0.")
    return Turn(**record)


def _trajectory_from_dict(record: Any, where: str) -> Trajectory:
    if not isinstance(record, dict):
        raise TrajectoryFormatError(f"{where}: a trajectory must be a JSON object, got {type(record).__name__}.")
    version = record.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise TrajectoryFormatError(
            f"{where}: schema_version {version} is newer than this agentkit understands ({SCHEMA_VERSION}): the file "
            "was written by a newer agentkit; upgrade agentkit (pip install -U agentkit) to read it."
        )
    _check_fields(record, _TRAJECTORY, where)
    if version != SCHEMA_VERSION:
        raise TrajectoryFormatError(f"{where}: unsupported schema_version {version!r}; expected {SCHEMA_VERSION}.")
    for key, allowed in _TRAJECTORY.choices.items():
        if key in record and record[key] not in allowed:
            raise TrajectoryFormatError(f"{where}: {key} must be {' or '.join(map(repr, allowed))}, got {record[key]!r}.")
    if not all(isinstance(s, str) and is_unicode(s) for s in record.get("skills", [])):
        raise TrajectoryFormatError(f"{where}: 'skills' must be a list of skill id strings.")
    try:  # the writer must be able to write back whatever the reader accepts
        json.dumps(record["sampling"], ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as err:  # NaN, a lone surrogate, a key JSON cannot carry
        raise TrajectoryFormatError(f"{where}: 'sampling' holds a value JSON cannot carry ({err}).") from err
    turns = [_turn_from_dict(t, f"{where}, turn {i}") for i, t in enumerate(record["turns"])]
    values = dict(record)
    values["turns"] = turns
    for name, key in _TRAJECTORY.renamed.items():
        values[name] = values.pop(key)
    return Trajectory(**values)
