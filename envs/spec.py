"""What an environment id stands for (``EnvSpec``), below the registry that maps ids to specs: an
environment module declares its own spec (``textarena_env.game_spec``) without importing the registry."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentkit.envs.formats import ACTION_TAG, ActionFormat
from agentkit.envs.protocol import Env

from agentkit.core.errors import ConfigError

DEFAULT_MAX_TURNS = 20  # for environments that do not declare theirs


@dataclass(frozen=True)
class EnvSpec:
    """What an environment id stands for.

    Attributes:
        factory: ``"package.module:Factory"`` or the class/callable itself; imported only by ``make``.
        kwargs: default keyword arguments for the factory (``make``'s override them).
        max_turns: the default turn limit, long enough for the expert plans of the default settings.
        splits: the task splits the factory accepts (``split="train"`` always exists).
        eval_split: the held-out split evaluation plays by default; None: ``"eval"`` when it is
            one of ``splits``, else ``"train"``.
        action_format: how the model answers (instruction, stop strings, parser, expert rendering).
        description: one line for ``agentkit envs list``.
        requires: modules that must import for the environment to work (checked by ``status``).
        programs: executables that must be on PATH (e.g. ``java``).
        extra: the ``agentkit[...]`` extra that installs the requirements, for messages.
        nondeterministic: the same seed and actions can give different observations (Gymnasium's
            ``EnvSpec.nondeterministic``: its ``check_env`` then skips the determinism checks).
    """

    factory: str | Callable[..., Env]
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    max_turns: int = DEFAULT_MAX_TURNS
    splits: tuple[str, ...] = ("train",)
    eval_split: str | None = None
    action_format: ActionFormat = ACTION_TAG
    description: str = ""
    requires: tuple[str, ...] = ()
    programs: tuple[str, ...] = ()
    extra: str | None = None
    nondeterministic: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.factory, str) or callable(self.factory)):
            raise ConfigError(f"EnvSpec.factory must be 'package.module:Factory' or a callable, got {self.factory!r}.")
        if isinstance(self.max_turns, bool) or not isinstance(self.max_turns, int) or self.max_turns <= 0:
            raise ConfigError(f"EnvSpec.max_turns must be a positive integer, got {self.max_turns!r}.")
        for name in ("splits", "requires", "programs"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) and v for v in value):
                raise ConfigError(f"EnvSpec.{name} must be a tuple of names, got {value!r}.")
            object.__setattr__(self, name, tuple(value))
        if "train" not in self.splits:
            raise ConfigError(f"EnvSpec.splits must include 'train' (every environment has it), got {self.splits!r}.")
        eval_split = self.eval_split or ("eval" if "eval" in self.splits else "train")
        if eval_split not in self.splits:
            raise ConfigError(f"EnvSpec.eval_split {eval_split!r} is not one of its splits {list(self.splits)}.")
        object.__setattr__(self, "eval_split", eval_split)
        if not isinstance(self.action_format, ActionFormat):
            raise ConfigError(f"EnvSpec.action_format must be an agentkit.envs.ActionFormat, got {self.action_format!r}.")
        object.__setattr__(self, "kwargs", dict(self.kwargs))


@dataclass(frozen=True, kw_only=True)
class EnvInfo(EnvSpec):
    """An id's ``EnvSpec`` with the id and the distribution that registered it (``env_info``).

    ``eval_split`` is always set here. ``kwargs`` is a copy: changing it changes nothing registered.
    """

    id: str
    distribution: str = "agentkit"
