"""Plugin lookup shared by the four seams: envs, objectives, teachers, retrievers.

Built-ins are listed in code (a plain checkout works with no entry points installed). The
entry-point group is read lazily, the first time a name is looked up or listed, never at import.
``package.module:attr`` works as an escape hatch for anything importable. A plugin that fails to
import raises: a silently missing plugin is worse than a loud one.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from agentkit.core.errors import MissingDependencyError, PluginError, UnknownNameError, did_you_mean


@dataclass(frozen=True)
class PluginSpec:
    """Where a plugin lives and how to get it.

    Attributes:
        name: the registered name (an environment id, an objective name, ...).
        target: ``"package.module:attr"``, or the object itself.
        extra: the ``agentkit[...]`` extra that provides its dependencies, if any.
        distribution: the distribution that declared it ("agentkit" for built-ins).
        defaults: keyword arguments bound at registration (e.g. game settings for an env id).
        description: one line for ``list`` commands.
        tags: capabilities the caller should know of before building the plugin.
    """

    name: str
    target: str | Callable[..., Any]
    extra: str | None = None
    distribution: str = "agentkit"
    defaults: tuple[tuple[str, Any], ...] = ()
    description: str = ""
    tags: frozenset[str] = frozenset()


def import_target(target: str, *, group: str, name: str, extra: str | None, distribution: str) -> Any:
    """Import ``package.module:attr``; turn a missing optional dependency into an install hint."""
    if ":" not in target:
        raise PluginError(
            f"{group} plugin {name!r} from {distribution!r} has target {target!r}; expected 'package.module:attr'."
        )
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        missing = getattr(err, "name", None) or ""
        ours = module_name.split(".")[0]
        if extra and missing and missing.split(".")[0] != ours:
            raise MissingDependencyError(
                f"{group} plugin {name!r} needs the package {missing!r}, which is not installed. "
                f"Install it with: pip install 'agentkit[{extra}]'"
            ) from err
        raise PluginError(
            f"{group} plugin {name!r} (from {distribution!r}) failed to import {module_name!r}: {err}"
        ) from err
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError as err:
        raise PluginError(
            f"{group} plugin {name!r} (from {distribution!r}): module {module_name!r} has no attribute {attr!r}."
        ) from err
    return obj


def _folded(name: str) -> str:
    """A name with dashes and underscores alike: either spelling of a registered name finds it."""
    return name.replace("-", "_")


class PluginRegistry:
    """Names -> plugins for one entry-point group."""

    def __init__(self, group: str, kind: str) -> None:
        self.group = group
        self.kind = kind  # "environment", "objective", ... used in messages
        self._specs: dict[str, PluginSpec] = {}
        self._entry_points_read = False

    def register(self, spec: PluginSpec, *, overwrite: bool = False) -> None:
        if spec.name in self._specs and not overwrite:
            existing = self._specs[spec.name]
            raise PluginError(
                f"{self.kind} {spec.name!r} is already registered (by {existing.distribution!r}); "
                "pass overwrite=True to replace it."
            )
        self._specs[spec.name] = spec

    def _read_entry_points(self) -> None:
        if self._entry_points_read:
            return
        self._entry_points_read = True
        for ep in importlib.metadata.entry_points(group=self.group):
            if ep.name in self._specs:
                continue  # built-ins and explicit registrations win
            dist = ep.dist.name if ep.dist is not None else "unknown distribution"
            self._specs[ep.name] = PluginSpec(name=ep.name, target=ep.value, distribution=dist)

    def specs(self) -> Iterator[PluginSpec]:
        self._read_entry_points()
        yield from sorted(self._specs.values(), key=lambda s: s.name)

    def names(self) -> list[str]:
        return [s.name for s in self.specs()]

    def spec(self, name: str) -> PluginSpec:
        if name in self._specs:
            return self._specs[name]
        self._read_entry_points()
        if name in self._specs:
            return self._specs[name]
        if ":" in name:  # escape hatch: package.module:attr
            return PluginSpec(name=name, target=name, distribution="(import path)")
        same = [spec for known, spec in self._specs.items() if _folded(known) == _folded(name)]
        if len(same) == 1:  # sage-opd is sage_opd, search_qa/generated-v0 is search-qa/generated-v0
            return same[0]
        raise UnknownNameError(
            f"Unknown {self.kind} {name!r}.{did_you_mean(name, self._specs)} "
            f"Known: {', '.join(sorted(self._specs)) or '(none)'}. Plugins register through the "
            f"{self.group!r} entry-point group."
        )

    def load(self, name: str) -> tuple[PluginSpec, Any]:
        """Return the spec and the imported object for ``name``."""
        spec = self.spec(name)
        if not isinstance(spec.target, str):
            return spec, spec.target
        obj = import_target(spec.target, group=self.group, name=name, extra=spec.extra, distribution=spec.distribution)
        return spec, obj
