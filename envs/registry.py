"""Environment ids -> factories: built-ins listed here, plugins from the ``agentkit.envs`` group.

An entry point ``NAME = package.module:Factory`` in the group ``agentkit.envs`` registers the id
NAME; ``Factory`` is an environment class or a callable returning an environment, called with the
keyword arguments given to ``make``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentkit.envs.protocol import Env
from agentkit.envs.wrappers import ActionParser, CleanObservation, ParseAction, TurnLimit

from agentkit.core.errors import (
    AgentkitError,
    ConfigError,
    EnvError,
    MissingDependencyError,
    UnknownNameError,
)
from agentkit.core.plugins import PluginRegistry, PluginSpec

REGISTRY = PluginRegistry("agentkit.envs", "environment")
PARSES_ACTIONS = "parses-actions"  # tag: the environment parses the model's whole response itself
# id prefixes of the environment families that optional extras provide
EXTRA_FAMILIES = {"textworld": "textworld", "alfworld": "alfworld", "scienceworld": "scienceworld", "search-qa": "search",
                  "webshop": "search"}

_TW = "agentkit.envs.textworld_env:TextWorldEnv"
_BUILTINS = [
    PluginSpec("textworld/simple-v0", _TW, "textworld", defaults=(("challenge", "tw-simple"),),
               description="TextWorld tw-simple (rewards, goal)"),
    PluginSpec("textworld/coin-v0", _TW, "textworld", defaults=(("challenge", "tw-coin_collector"),),
               description="TextWorld Coin Collector (level, goal: detailed|brief)"),
    PluginSpec("textworld/treasure-v0", _TW, "textworld", defaults=(("challenge", "tw-treasure_hunter"),),
               description="TextWorld Treasure Hunter (level)"),
    PluginSpec("textworld/cooking-v0", _TW, "textworld", defaults=(("challenge", "tw-cooking"),),
               description="TextWorld Cooking (recipe, take, go, open, cook, cut, drop)"),
]
_BUILTINS += [
    PluginSpec("alfworld/alfworld-v0", "agentkit.envs.alfworld_env:AlfWorldEnv", "alfworld",
               description="ALFWorld household tasks, generated offline (or the official games via ALFWORLD_DATA)"),
    PluginSpec("scienceworld/scienceworld-v0", "agentkit.envs.scienceworld_env:ScienceWorldEnv", "scienceworld",
               description="ScienceWorld's 30 science tasks (tasks, simplifications; needs Java)"),
    PluginSpec("search-qa/generated-v0", "agentkit.envs.search_qa_env:SearchQAEnv", "search",
               description="Search-R1-style QA over a generated corpus (retriever bm25s|pyserini|http)",
               tags=frozenset({PARSES_ACTIONS})),
]
_WEBSHOP = "agentkit.envs.webshop_env:WebShopEnv"
_BUILTINS += [
    PluginSpec("webshop/generated-v0", _WEBSHOP, "search", defaults=(("source", "generated"),),
               description="WebShop shopping over a catalog generated offline (num_products, catalog_seed, retriever bm25s|pyserini)"),
    PluginSpec("webshop/original-v0", _WEBSHOP, "search", defaults=(("source", "original"),),
               description="WebShop on the original data files (data_dir or WEBSHOP_DATA; goals human|synthetic)"),
]
_BUILTINS += [  # pure Python, no extra: the core tests' environment
    PluginSpec("vaults/vaults-v0", "agentkit.envs.vaults_env:VaultsEnv",
               description="Vaults: family rules for the right exit, learnable from skills (families, chambers, exits, moves)"),
]
for _spec in _BUILTINS:
    REGISTRY.register(_spec)


def register(
    id: str,
    entry_point: str | Callable[..., Env],
    *,
    extra: str | None = None,
    description: str = "",
    parses_actions: bool = False,
    overwrite: bool = False,
    **defaults: Any,
) -> None:
    """Register an environment id.

    Args:
        id: ``name`` or ``name/Variant-vN``.
        entry_point: ``"package.module:Factory"`` or the factory itself.
        extra: the agentkit extra that installs its dependencies, for error messages.
        description: one line for ``agentkit envs list``.
        parses_actions: the environment parses the model's whole response itself; the collector
            then passes it through without the ``<action>`` parser.
        overwrite: replace an existing registration.
        **defaults: keyword arguments passed to the factory (overridden by ``make``'s).
    """
    REGISTRY.register(
        PluginSpec(id, entry_point, extra, distribution="(registered at run time)",
                   defaults=tuple(defaults.items()), description=description,
                   tags=frozenset({PARSES_ACTIONS} if parses_actions else ())),
        overwrite=overwrite,
    )


@dataclass(frozen=True)
class EnvStatus:
    id: str
    available: bool
    detail: str  # the description, or what is missing
    distribution: str


def parses_own_actions(id: str) -> bool:
    """True for environments that read the model's whole response themselves (tool-use formats
    like Search-R1's ``<search>``/``<answer>``) instead of an ``<action>`` tag. Registered with
    ``register(..., parses_actions=True)``, or a factory attribute ``parses_actions = True``."""
    spec = lookup(id)
    if PARSES_ACTIONS in spec.tags:
        return True
    _, factory = REGISTRY.load(id)
    return getattr(factory, "parses_actions", False) is True


def lookup(id: str) -> PluginSpec:
    """The registration of ``id``; an unknown id gets "did you mean" and, for a family an extra
    provides, the install command."""
    try:
        return REGISTRY.spec(id)
    except UnknownNameError as err:
        family = id.split("/")[0]
        if family in EXTRA_FAMILIES:
            raise UnknownNameError(
                f"{err} Environments named '{family}/...' come with: pip install 'agentkit[{EXTRA_FAMILIES[family]}]'"
            ) from err
        raise


def make(
    id: str,
    *,
    max_turns: int | None = None,
    action_parser: ActionParser | None = None,
    clean: bool = True,
    **kwargs: Any,
) -> Env:
    """Build an environment and wrap it.

    Args:
        id: a registered id (``agentkit envs list``) or ``package.module:Factory``.
        max_turns: truncate episodes after this many steps (``TurnLimit``).
        action_parser: parse model text into actions (``ParseAction``); None passes actions
            through unchanged.
        clean: strip prompt characters and padding from observations (``CleanObservation``).
        **kwargs: passed to the environment's factory, over its registered defaults.
    """
    lookup(id)
    spec, factory = REGISTRY.load(id)
    if not callable(factory):
        raise EnvError(f"Environment {id!r} (from {spec.distribution!r}) resolved to {factory!r}, which is not callable.")
    params = {**dict(spec.defaults), **kwargs}
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
        if spec.extra:
            raise MissingDependencyError(
                f"Environment {id!r} needs {getattr(err, 'name', None) or err}. "
                f"Install it with: pip install 'agentkit[{spec.extra}]'"
            ) from err
        raise
    for method in ("reset", "step", "close"):
        if not callable(getattr(env, method, None)):
            raise EnvError(
                f"Environment {id!r} (from {spec.distribution!r}) built {type(env).__name__}, which has no "
                f"{method}() method; an environment needs reset(), step() and close()."
            )
    if clean:
        env = CleanObservation(env)
    if action_parser is not None:
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


def status() -> list[EnvStatus]:
    """Every known environment and whether it can be built here (imports its module)."""
    rows = []
    for spec in REGISTRY.specs():
        try:
            REGISTRY.load(spec.name)
        except MissingDependencyError:
            rows.append(EnvStatus(spec.name, False, f"missing: pip install 'agentkit[{spec.extra}]'", spec.distribution))
            continue
        except AgentkitError as err:
            rows.append(EnvStatus(spec.name, False, f"broken: {err}", spec.distribution))
            continue
        rows.append(EnvStatus(spec.name, True, spec.description, spec.distribution))
    return rows
