"""Gymnasium, both ways: agentkit's environments are ``gymnasium.Env``s, and Gymnasium's text
environments play in agentkit.

- Spaces. Every built-in derives from ``TextEnv``: ``Text`` observation and action spaces of the
  class ``AnyText``, which holds any string up to ``MAX_CHARS`` characters (Gymnasium's ``Text``
  holds only its charset, and game text has punctuation, newlines and non-ASCII letters).
- Seeds. agentkit's ``reset(seed=s)`` plays task ``s`` of the split and refuses seeds past its
  tasks. Gymnasium callers pass any seed (``check_env`` 123 and 456, vector environments ``s, s+1,
  ...``), so the environments ``gymnasium.make`` builds wrap them around (``wrap_seeds``): seed ``s``
  plays task ``s % num_tasks``, which is task ``s`` for every seed within the split. ``reset()``
  without a seed draws the task from ``np_random``, so unseeded resets after ``reset(seed=s)``
  replay the same tasks, as Gymnasium expects.
- Ids. ``gymnasium_id`` maps ``family/Variant-vN`` to ``agentkit/family-Variant-vN``, writing the
  family once when the variant repeats it: ``textworld/coin-v0`` is ``agentkit/textworld-coin-v0``,
  ``vaults/vaults-v0`` is ``agentkit/vaults-v0``. Gymnasium 1.x reads no plugin entry points, so
  ``import agentkit.envs`` registers the built-ins, ``agentkit.envs.register`` each id it adds, and
  ``register_gymnasium()`` every id (entry-point plugins too; it and ``make_for_gymnasium``, which
  read the registry, sit above it in envs/gym_registration.py). ``gymnasium.make("agentkit/...")`` builds
  the bare environment (bare commands in, no action parser) with cleaned observations (``CleanText``)
  and the registered turn limit as ``max_episode_steps``; its kwargs are the environment's settings.
- The other way. The agentkit id ``gymnasium/<Gymnasium id>`` plays ``gymnasium.make(<Gymnasium id>)``
  (``gymnasium/mypkg.games:Guess-v0`` imports ``mypkg.games`` first, as Gymnasium does); both of its
  spaces must be ``Text``, and ``FromGymnasium`` gives the info keys agentkit reads that it lacks.
  A Gymnasium environment registered in agentkit (``register("x", MyEnv)``, an entry point) is
  played as it is: its info must carry ``INFO_KEYS``, as ``agentkit envs check`` says.
"""

from __future__ import annotations

import functools
import importlib
import operator
import string
from typing import TYPE_CHECKING, Any, ClassVar

import gymnasium
from agentkit.envs.protocol import Env, StepResult
from agentkit.envs.wrappers import Wrapper, clean_text
from gymnasium.envs.registration import WrapperSpec, get_env_id, parse_env_id
from gymnasium.spaces import Text

from agentkit.core.errors import ConfigError, EnvError, PluginError, UnknownNameError

if TYPE_CHECKING:
    import numpy as np
    from agentkit.envs.spec import EnvSpec

MAX_CHARS = 1 << 16  # the longest observation or action: far above any built-in's (pages of a few thousand)
NAMESPACE = "agentkit"  # the Gymnasium namespace of agentkit's ids
GYMNASIUM_PREFIX = "gymnasium/"  # agentkit ids of this form play a Gymnasium environment
# what gymnasium.make builds for an agentkit id: above the registry (it makes the environment), so named, not imported
MAKE_FOR_GYMNASIUM = "agentkit.envs.gym_registration:make_for_gymnasium"
_SAMPLE_CHARS = string.ascii_letters + string.digits + string.punctuation + " "


class AnyText(Text):
    """A ``Text`` space holding any string of ``min_length`` to ``max_length`` characters; samples
    are printable ASCII. Not flattenable to arrays (its characters are not a fixed charset)."""

    def __init__(self, max_length: int = MAX_CHARS, *, min_length: int = 0,
                 seed: int | np.random.Generator | None = None) -> None:
        super().__init__(max_length, min_length=min_length, charset=_SAMPLE_CHARS, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"AnyText({self.min_length}, {self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AnyText) and (self.min_length, self.max_length) == (other.min_length, other.max_length)


class TextEnv(gymnasium.Env[str, str]):
    """The base of agentkit's environments: a ``gymnasium.Env`` with text in and text out.

    A subclass's ``reset`` starts with ``seed = self.task_seed(seed, num_tasks)``, which seeds
    ``np_random`` (Gymnasium's ``super().reset(seed=seed)``) and returns the task seed to play.

    Attributes:
        wrap_seeds: seeds past the split's tasks play task ``seed % num_tasks`` instead of being
            refused; ``gymnasium.make`` sets it, agentkit's ``make`` does not.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    wrap_seeds: bool = False

    @functools.cached_property
    def observation_space(self) -> AnyText:  # type: ignore[override]
        return AnyText()

    @functools.cached_property
    def action_space(self) -> AnyText:  # type: ignore[override]
        return AnyText()

    def task_seed(self, seed: Any, num_tasks: int) -> Any:
        """Seed ``np_random`` as Gymnasium's ``reset`` does and return the task seed to play: ``seed``
        (``seed % num_tasks`` with ``wrap_seeds``), or for None one drawn from ``np_random``. Anything
        but a non-negative integer comes back unchanged, for the environment's own check to refuse."""
        if seed is None:
            return int(self.np_random.integers(num_tasks))
        index = _seed_index(seed)
        if index is None:
            return seed
        super().reset(seed=index)
        return index % num_tasks if self.wrap_seeds else index


def _seed_index(seed: Any) -> int | None:
    """``seed`` as a Python int when it is a non-negative integer (numpy's too), else None."""
    try:
        index = operator.index(seed)
    except TypeError:
        return None
    return None if isinstance(seed, bool) or index < 0 else index


class CleanText(gymnasium.ObservationWrapper[str, str, str], gymnasium.utils.RecordConstructorArgs):
    """``clean_text`` on every observation: agentkit's ``CleanObservation`` in Gymnasium's wrapper stack."""

    def __init__(self, env: gymnasium.Env[str, str]) -> None:
        gymnasium.utils.RecordConstructorArgs.__init__(self)
        gymnasium.ObservationWrapper.__init__(self, env)

    def observation(self, observation: str) -> str:
        return clean_text(observation)


class AsGymnasium(TextEnv):
    """An agentkit environment that is not a ``gymnasium.Env`` (the protocol alone), as one, for
    ``gymnasium.make``: seeds go to it unchanged, so ``reset()`` is as random as it makes it."""

    def __init__(self, env: Env) -> None:
        self.env = env

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        result = self.env.reset(seed=seed, options=options)  # its own check refuses bad seeds first
        super().reset(seed=_seed_index(seed))
        return result

    def step(self, action: str) -> StepResult:
        return self.env.step(action)

    def close(self) -> None:
        self.env.close()


def require_text_spaces(env: gymnasium.Env, id: str) -> None:
    """Close ``env`` and raise ``EnvError`` unless both of its spaces are ``Text``."""
    observations, actions = env.observation_space, env.action_space
    if not (isinstance(observations, Text) and isinstance(actions, Text)):
        env.close()
        raise EnvError(
            f"Environment {id!r} is a Gymnasium environment with a {type(observations).__name__} observation space and "
            f"a {type(actions).__name__} action space; agentkit plays text, so both must be gymnasium.spaces.Text "
            "(wrap it to turn its observations and actions into text)."
        )


class FromGymnasium(Wrapper):
    """A Gymnasium environment's steps in agentkit's types: a float reward, bool flags, and the
    ``INFO_KEYS`` its info lacks: ``task`` "", ``admissible_actions`` None, ``action_valid`` True
    (Gymnasium has no invalid actions), ``won`` its ``is_success`` (Gymnasium's convention) or False,
    ``score`` the episode's summed reward, ``privileged`` None."""

    def __init__(self, env: gymnasium.Env[str, str]) -> None:
        super().__init__(env)
        self.score = 0.0

    def _info(self, info: dict[str, Any]) -> dict[str, Any]:
        defaults = {"task": "", "admissible_actions": None, "action_valid": True,
                    "won": bool(info.get("is_success", False)), "score": self.score, "privileged": None}
        return {**defaults, **info}

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        self.score = 0.0
        return obs, self._info(info)

    def step(self, action: str) -> StepResult:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.score += float(reward)
        return obs, float(reward), bool(terminated), bool(truncated), self._info(info)


def from_gymnasium(gymnasium_id: str, split: str = "train", **kwargs: Any) -> Env:
    """The factory of the agentkit id ``gymnasium/<gymnasium_id>``: ``gymnasium.make(gymnasium_id,
    **kwargs)`` without its ``TimeLimit`` (agentkit's turn limit takes its place), in ``FromGymnasium``."""
    if split != "train":
        raise ConfigError(f"gymnasium/{gymnasium_id} has one task set (split 'train'), got split {split!r}; "
                          "pass the environment's own settings with --env-kwargs.")
    env = gymnasium.make(gymnasium_id, max_episode_steps=-1, **kwargs)
    require_text_spaces(env, GYMNASIUM_PREFIX + gymnasium_id)
    return FromGymnasium(env)


def gymnasium_max_steps(gymnasium_id: str) -> int | None:
    """The ``max_episode_steps`` Gymnasium registered for ``gymnasium_id`` (importing its module for
    ``module:Id``); ``UnknownNameError`` when Gymnasium has no such id."""
    module, _, name = gymnasium_id.rpartition(":")
    try:
        if module:  # gymnasium.make imports it too; gymnasium.spec does not
            importlib.import_module(module)
        return gymnasium.spec(name).max_episode_steps
    except (gymnasium.error.Error, ModuleNotFoundError) as err:
        raise UnknownNameError(
            f"Unknown Gymnasium environment {gymnasium_id!r}: {err} Register it with gymnasium.register, or name the "
            f"module that registers it: gymnasium/package.module:{name}"
        ) from err


def gymnasium_id(agentkit_id: str) -> str:
    """The Gymnasium id of an agentkit id: ``family/Variant-vN`` -> ``agentkit/family-Variant-vN``, the
    family written once when the variant repeats it (``vaults/vaults-v0`` -> ``agentkit/vaults-v0``);
    ``name`` -> ``agentkit/name``."""
    family, slash, variant = agentkit_id.partition("/")
    if not slash:
        name = agentkit_id
    elif variant == family or variant.startswith(f"{family}-"):
        name = variant
    else:
        name = f"{family}-{variant}"
    result = f"{NAMESPACE}/{name}"
    try:
        parsed = parse_env_id(result)
    except gymnasium.error.Error:
        parsed = None
    if ":" in name or parsed is None or get_env_id(*parsed) != result:
        raise ConfigError(f"Environment id {agentkit_id!r} has no Gymnasium id: ids are 'name' or 'name/Variant-vN', "
                          "made of letters, digits, '_', '-' and '.'.")
    return result


def free_gymnasium_id(agentkit_id: str) -> str:
    """``gymnasium_id(agentkit_id)``, checked to be free in Gymnasium's registry or ``agentkit_id``'s own."""
    gid = gymnasium_id(agentkit_id)
    existing = gymnasium.registry.get(gid)
    if existing is not None and existing.kwargs.get("agentkit_id") != agentkit_id:
        owner = existing.kwargs.get("agentkit_id") or existing.entry_point
        raise PluginError(f"Environment {agentkit_id!r} would be Gymnasium's {gid!r}, which is {owner!r}'s already; "
                          "rename one of them.")
    return gid


def register_in_gymnasium(agentkit_id: str, spec: EnvSpec) -> str:
    """Register ``agentkit_id`` with Gymnasium (again, if it was): ``spec.max_turns`` is its
    ``max_episode_steps``. Return its Gymnasium id."""
    gid = free_gymnasium_id(agentkit_id)
    gymnasium.registry.pop(gid, None)  # re-registering the same id replaces it quietly
    gymnasium.register(gid, entry_point=MAKE_FOR_GYMNASIUM, max_episode_steps=spec.max_turns,
                       nondeterministic=spec.nondeterministic, kwargs={"agentkit_id": agentkit_id},
                       additional_wrappers=(WrapperSpec("CleanText", f"{__name__}:CleanText", {}),))
    return gid
