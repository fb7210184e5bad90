"""Environment ids -> specs: built-ins listed here, plugins from the ``agentkit.envs`` group.

Every id stands for an ``EnvSpec``: the factory that builds the environment plus what belongs to
the environment rather than to a command: its default settings (``kwargs``), a turn limit long
enough for its expert plans (``max_turns``), its task splits and the held-out one (``splits``,
``eval_split``), its action format (the system prompt's instruction, stop strings, parser and
how expert actions are written), the modules and programs it needs (``requires``, ``programs``)
and the line ``agentkit envs list`` shows. ``env_info(id)`` reads it without building the
environment (built-ins import nothing; a plugin's module is imported), so commands fill their
defaults from it.

Plugins. An entry point ``NAME = package.module:attr`` in the group ``agentkit.envs`` registers the
id NAME. ``attr`` is either

- an ``EnvSpec`` (``EnvSpec(factory=MyEnv, max_turns=12, splits=("train", "eval"),
  action_format=ActionFormat(...), description="...")``): the way to declare any of the above; or
- an environment class, or a callable returning an environment: it gets ``EnvSpec``'s defaults
  (the ``<action>...</action>`` format, ``DEFAULT_MAX_TURNS`` turns, the one split ``train``, no
  description).

Either way the factory is called with the registered ``kwargs`` overridden by those given to
``make``, plus ``split`` when it takes one. ``register(id, ...)`` does the same at run time, and an
id of the form ``package.module:attr`` needs no registration at all.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import shutil
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Literal

import gymnasium
from agentkit.envs.formats import ACTION_TAG, BRACKET_ACTION_TAG, SEARCH_ANSWER, ActionFormat
from agentkit.envs.gym import (
    GYMNASIUM_PREFIX,
    free_gymnasium_id,
    from_gymnasium,
    gymnasium_max_steps,
    register_in_gymnasium,
    require_text_spaces,
)
from agentkit.envs.protocol import Env
from agentkit.envs.spec import DEFAULT_MAX_TURNS, EnvInfo, EnvSpec
from agentkit.envs.wrappers import ActionParser, CleanObservation, ParseAction, TurnLimit

from agentkit.core.errors import (
    AgentkitError,
    ConfigError,
    EnvError,
    MissingDependencyError,
    PluginError,
    UnknownNameError,
)
from agentkit.core.plugins import PluginRegistry, PluginSpec, import_target

REGISTRY = PluginRegistry("agentkit.envs", "environment")
# id prefixes of the environment families that optional extras provide
EXTRA_FAMILIES = {"textworld": "textworld", "alfworld": "alfworld", "scienceworld": "scienceworld", "search-qa": "search",
                  "webshop": "search", "textarena": "textarena"}
_TW = "agentkit.envs.textworld_env:TextWorldEnv"
_TEXTWORLD = {"splits": ("train", "eval"), "requires": ("textworld",), "extra": "textworld"}
_SEARCH = {"splits": ("train", "eval"), "requires": ("bm25s",), "extra": "search"}
_WEBSHOP = "agentkit.envs.webshop.env:WebShopEnv"
# ids are textarena/<TextArena's own id>; max_turns is TextArena's own turn limit for the game
_TA = "agentkit.envs.textarena_env:TextArenaEnv"
_TEXTARENA = {"action_format": BRACKET_ACTION_TAG, "requires": ("textarena",), "extra": "textarena"}
# max_turns: the longest expert plan measured with the default settings, with margin (play_expert on the
# first tasks of train and eval): TextWorld simple 12 steps, coin (level 3) 3, treasure 3, cooking 3; ALFWorld
# (generated; the official games of ALFWORLD_DATA need its own limit, 50) 7; ScienceWorld's gold paths 22-229 (inclined-plane-friction-unnamed-surfaces the longest);
# Search-QA 5 (4 searches and the answer); WebShop 5; Vaults ends itself after its 6 moves; TextArena
# GuessTheNumber 5 (binary search of 1-20), TowerOfHanoi 7 (3 disks)
_BUILTINS: dict[str, EnvSpec] = {
    "textworld/simple-v0": EnvSpec(_TW, {"challenge": "tw-simple"}, max_turns=20, **_TEXTWORLD,
                                   description="TextWorld tw-simple (rewards, goal)"),
    # level 3: the setting the shipped default policy was trained on (README: the recipe)
    "textworld/coin-v0": EnvSpec(_TW, {"challenge": "tw-coin_collector", "level": 3}, max_turns=8, **_TEXTWORLD,
                                 description="TextWorld Coin Collector (level, goal: detailed|brief)"),
    "textworld/treasure-v0": EnvSpec(_TW, {"challenge": "tw-treasure_hunter"}, max_turns=8, **_TEXTWORLD,
                                     description="TextWorld Treasure Hunter (level)"),
    "textworld/cooking-v0": EnvSpec(_TW, {"challenge": "tw-cooking"}, max_turns=8, **_TEXTWORLD,
                                    description="TextWorld Cooking (recipe, take, go, open, cook, cut, drop)"),
    "alfworld/alfworld-v0": EnvSpec(
        "agentkit.envs.alfworld.env:AlfWorldEnv", max_turns=20, splits=("train", "eval_in", "eval_out"),
        eval_split="eval_in", requires=("textworld", "alfworld", "textworld.envs.pddl"), extra="alfworld",
        description="ALFWorld household tasks, generated offline (or the official games via ALFWORLD_DATA)"),
    "scienceworld/scienceworld-v0": EnvSpec(
        "agentkit.envs.scienceworld_env:ScienceWorldEnv", max_turns=300, splits=("train", "dev", "test"),
        eval_split="dev", requires=("scienceworld",), programs=("java",), extra="scienceworld",
        nondeterministic=True,  # its observations list a room's objects in an order that varies between loads
        description="ScienceWorld's 30 science tasks (tasks, simplifications; needs Java)"),
    "search-qa/generated-v0": EnvSpec(
        "agentkit.envs.search_qa.env:SearchQAEnv", max_turns=8, action_format=SEARCH_ANSWER, **_SEARCH,
        description="Search-R1-style QA over a generated corpus (retriever bm25s|pyserini|http)"),
    "webshop/generated-v0": EnvSpec(
        _WEBSHOP, {"source": "generated"}, max_turns=10, **_SEARCH,
        description="WebShop shopping over a catalog generated offline (num_products, catalog_seed, retriever bm25s|pyserini)"),
    "webshop/original-v0": EnvSpec(
        _WEBSHOP, {"source": "original"}, max_turns=10, splits=("train", "eval", "test"), requires=("bm25s",),
        extra="search", description="WebShop on the original data files (data_dir or WEBSHOP_DATA; goals human|synthetic)"),
    # TextArena's offline single-player games that have an expert (envs/textarena_env.py); Wordle, Hangman and
    # the other word games need NLTK data downloads, and any other game plays with the `game` setting
    "textarena/GuessTheNumber-v0": EnvSpec(
        _TA, {"game": "GuessTheNumber-v0"}, max_turns=10, splits=("train", "eval"), **_TEXTARENA,
        description="TextArena GuessTheNumber: find 1-20 from higher/lower hints (min_number, max_number)"),
    "textarena/TowerOfHanoi-v0": EnvSpec(
        _TA, {"game": "TowerOfHanoi-v0"}, max_turns=14, **_TEXTARENA,
        description="TextArena Tower of Hanoi, 3 disks from A to C: one puzzle, the same for every seed"),
    # pure Python, no extra: the core tests' environment; it ends itself after `moves` (6) moves
    "vaults/vaults-v0": EnvSpec(
        "agentkit.envs.vaults_env:VaultsEnv", max_turns=8, splits=("train", "dev", "test"), eval_split="dev",
        description="Vaults: family rules for the right exit, learnable from skills (families, chambers, exits, moves)"),
}


def _plugin_spec(id: str, spec: EnvSpec, distribution: str = "agentkit") -> PluginSpec:
    # the registry's own record; its target is the EnvSpec itself, so looking it up imports nothing
    return PluginSpec(id, spec, spec.extra, distribution=distribution, defaults=tuple(spec.kwargs.items()),
                      description=spec.description)


for _id, _spec in _BUILTINS.items():
    REGISTRY.register(_plugin_spec(_id, _spec))
    register_in_gymnasium(_id, _spec)  # gymnasium.make("agentkit/...") (envs/gym.py)


def register(
    id: str,
    entry_point: str | Callable[..., Env] | EnvSpec,
    *,
    overwrite: bool = False,
    action_format: ActionFormat = ACTION_TAG,
    max_turns: int = DEFAULT_MAX_TURNS,
    splits: tuple[str, ...] = ("train",),
    eval_split: str | None = None,
    description: str = "",
    requires: tuple[str, ...] = (),
    programs: tuple[str, ...] = (),
    extra: str | None = None,
    **kwargs: Any,
) -> None:
    """Register an environment id at run time, and with Gymnasium as ``gymnasium_id(id)``.

    Args:
        id: ``name`` or ``name/Variant-vN``.
        entry_point: an ``EnvSpec`` (then give none of the other fields), ``"package.module:Factory"``
            or the factory itself.
        overwrite: replace an existing registration.
        action_format, max_turns, splits, eval_split, description, requires, programs, extra: the
            ``EnvSpec`` fields.
        **kwargs: default keyword arguments for the factory (overridden by ``make``'s).
    """
    if isinstance(entry_point, EnvSpec):
        given = {"action_format": action_format is not ACTION_TAG, "max_turns": max_turns != DEFAULT_MAX_TURNS,
                 "splits": splits != ("train",), "eval_split": eval_split is not None, "description": bool(description),
                 "requires": bool(requires), "programs": bool(programs), "extra": extra is not None, "kwargs": bool(kwargs)}
        if any(given.values()):
            raise ConfigError(f"register({id!r}, EnvSpec(...)) takes its settings from the EnvSpec; also given: "
                              f"{[name for name, was in given.items() if was]}. Put them in the EnvSpec.")
        spec = entry_point
    else:
        spec = EnvSpec(entry_point, kwargs, max_turns=max_turns, splits=splits, eval_split=eval_split,
                       action_format=action_format, description=description, requires=requires, programs=programs,
                       extra=extra)
    free_gymnasium_id(id)  # a bad or taken Gymnasium id fails before anything is registered
    REGISTRY.register(_plugin_spec(id, spec, "(registered at run time)"), overwrite=overwrite)
    register_in_gymnasium(id, spec)


@dataclass(frozen=True)
class EnvStatus:
    id: str
    available: bool
    detail: str  # the description, or what is missing
    distribution: str


def _gymnasium_spec(gymnasium_id: str) -> EnvSpec:
    return EnvSpec(functools.partial(from_gymnasium, gymnasium_id),
                   max_turns=gymnasium_max_steps(gymnasium_id) or DEFAULT_MAX_TURNS,
                   description=f"Gymnasium's {gymnasium_id}")


def _textarena_spec(game: str) -> EnvSpec:
    try:
        from agentkit.envs.textarena_env import game_spec
    except ImportError as err:
        raise MissingDependencyError(f"textarena/{game} needs TextArena: pip install -e '.[textarena]' ({err}).") from err
    return game_spec(game)


# families whose ids name another hub's environment (the rest of the id is the hub's own id); each
# resolves on first lookup: gymnasium/<Gymnasium id>, textarena/<TextArena game id>
FAMILY_RESOLVERS: dict[str, tuple[Callable[[str], EnvSpec], str]] = {
    GYMNASIUM_PREFIX: (_gymnasium_spec, "gymnasium"), "textarena/": (_textarena_spec, "textarena")}


def lookup(id: str) -> PluginSpec:
    """The registry's record of ``id``; an unknown id gets "did you mean" and, for a family an
    extra provides, the install command. ``gymnasium/<Gymnasium id>`` is registered on first lookup."""
    for prefix, (resolve, hub) in FAMILY_RESOLVERS.items():
        if id.startswith(prefix) and id not in REGISTRY.names():
            REGISTRY.register(_plugin_spec(id, resolve(id.removeprefix(prefix)), hub))
    try:
        return REGISTRY.spec(id)
    except UnknownNameError as err:
        family = id.split("/")[0]
        if family in EXTRA_FAMILIES:
            raise UnknownNameError(
                f"{err} Environments named '{family}/...' come with: pip install 'agentkit[{EXTRA_FAMILIES[family]}]'"
            ) from err
        raise


def env_info(id: str) -> EnvInfo:
    """What ``id`` is: its factory, default settings, turn limit, splits, action format, description.

    Builds nothing: a built-in imports no module; an entry-point plugin or a ``package.module:attr``
    id imports the module that defines it. A plugin that resolves to neither an ``EnvSpec`` nor a
    callable is a ``PluginError``.
    """
    record = lookup(id)
    _, target = REGISTRY.load(record.name)
    if isinstance(target, EnvSpec):
        spec = target
    elif callable(target):
        spec = EnvSpec(target)
    else:
        raise PluginError(
            f"Environment {id!r} (from {record.distribution!r}, entry-point group {REGISTRY.group!r}) resolved to "
            f"{target!r}; expected an agentkit.envs.EnvSpec, an environment class or a callable returning an environment."
        )
    values = {f.name: getattr(spec, f.name) for f in fields(EnvSpec)}
    return EnvInfo(**values, id=record.name, distribution=record.distribution)  # the registered spelling


def _factory(info: EnvInfo) -> Callable[..., Env]:
    if not isinstance(info.factory, str):
        return info.factory
    factory = import_target(info.factory, group=REGISTRY.group, name=info.id, extra=info.extra,
                            distribution=info.distribution)
    if not callable(factory):
        raise EnvError(f"Environment {info.id!r} (from {info.distribution!r}): {info.factory} is {factory!r}, "
                       "which is not callable.")
    return factory


def make(
    id: str,
    *,
    max_turns: int | None = None,
    action_parser: ActionParser | Literal["format"] | None = None,
    clean: bool = True,
    **kwargs: Any,
) -> Env:
    """Build an environment and wrap it.

    Args:
        id: a registered id (``agentkit envs list``) or ``package.module:Factory``.
        max_turns: truncate episodes after this many steps (``TurnLimit``).
        action_parser: how model text becomes an action (``ParseAction``): ``"format"`` for the
            parser of the environment's action format (what a policy's responses need; nothing
            when the environment reads whole responses itself), an ``ActionParser``, or None to
            pass actions through unchanged (experts, checkers and scripts that send bare commands).
        clean: strip prompt characters and padding from observations (``CleanObservation``).
        **kwargs: passed to the environment's factory, over its registered defaults.
    """
    info = env_info(id)
    factory = _factory(info)
    params = {**info.kwargs, **kwargs}
    if "split" in params and not _accepts(factory, "split"):
        # environments without splits play their one task set; asking for another is an error
        if params.pop("split") not in (None, "train"):
            raise ConfigError(f"Environment {id!r} has no task splits (its factory takes no 'split' argument); use split 'train'.")
    try:
        env = factory(**params)
    except TypeError as err:
        raise EnvError(f"Environment {id!r} rejected its arguments {sorted(params)}: {err}") from err
    except MissingDependencyError:
        raise
    except ImportError as err:
        if info.extra:
            raise MissingDependencyError(
                f"Environment {id!r} needs {getattr(err, 'name', None) or err}. "
                f"Install it with: pip install 'agentkit[{info.extra}]'"
            ) from err
        raise
    for method in ("reset", "step", "close"):
        if not callable(getattr(env, method, None)):
            raise EnvError(
                f"Environment {id!r} (from {info.distribution!r}) built {type(env).__name__}, which has no "
                f"{method}() method; an environment needs reset(), step() and close()."
            )
    if isinstance(env, gymnasium.Env):
        require_text_spaces(env, id)
    if clean:
        env = CleanObservation(env)
    if action_parser == "format":
        fmt = info.action_format
        if fmt.parser is not None:
            env = ParseAction(env, fmt.parser, fmt.invalid_feedback)
    elif action_parser is not None:
        env = ParseAction(env, action_parser)
    if max_turns is not None:
        env = TurnLimit(env, max_turns)
    return env


def _accepts(factory: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


@functools.cache
def _import_problem(module: str) -> str | None:
    """Why ``module`` does not import here, or None when it does (once per process)."""
    try:
        importlib.import_module(module)
    except Exception as err:  # any failure at import (not only ImportError) means it cannot be used
        return f"{module} ({type(err).__name__}: {err})"
    return None


def missing_requirements(info: EnvInfo) -> list[str]:
    """The declared modules that do not import and the programs not on PATH."""
    missing = [problem for module in info.requires if (problem := _import_problem(module))]
    return missing + [f"{program} (not on PATH)" for program in info.programs if shutil.which(program) is None]


def status() -> list[EnvStatus]:
    """Every known environment and whether it can be built here: its module (a plugin's, or the
    factory's) imports, and so does every module it requires, and its programs are on PATH."""
    rows = []
    for record in REGISTRY.specs():
        try:
            info = env_info(record.name)
            _factory(info)
        except MissingDependencyError as err:  # its message names the package and the install command
            rows.append(EnvStatus(record.name, False, f"missing: {err}", record.distribution))
            continue
        except AgentkitError as err:
            rows.append(EnvStatus(record.name, False, f"broken: {err}", record.distribution))
            continue
        missing = missing_requirements(info)
        if missing:  # the command first: a narrow listing cuts the end of the line
            hint = f"pip install 'agentkit[{info.extra}]'; " if info.extra else ""
            rows.append(EnvStatus(record.name, False, f"{hint}missing: {', '.join(missing)}", info.distribution))
            continue
        rows.append(EnvStatus(record.name, True, info.description, info.distribution))
    return rows
