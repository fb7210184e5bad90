"""The objective protocol and the registry of objectives (entry-point group ``agentkit.objectives``).

An objective is a class with a pydantic ``Config`` (its fields are the objective's settings, set
with ``--set objective.args.NAME=VALUE``) and two methods: ``prepare`` turns trajectories into a
``TokenBatch`` (advantages, weights, masks), ``loss`` turns a batch and the policy's logprobs into
(loss, metrics). The training loop never looks at an objective's name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from agentkit.objectives.batch import TokenBatch
from pydantic import BaseModel, ValidationError

from agentkit.core.errors import ConfigError, PluginError
from agentkit.core.plugins import PluginRegistry, PluginSpec
from agentkit.core.trajectory import Trajectory


@runtime_checkable
class Objective(Protocol):
    """A loss plugin.

    Attributes:
        Config: the pydantic model of its settings (unknown keys are errors).
        needs_reference: the loop must fill ``batch.ref_logprobs`` from a frozen reference model.
        uses_demonstrations: trains on expert demonstrations (``train.demos``) instead of rollouts.
    """

    Config: ClassVar[type[BaseModel]]
    needs_reference: bool
    uses_demonstrations: bool

    def prepare(self, trajectories: Sequence[Trajectory]) -> TokenBatch:
        """Trajectories of one step (groups of G samples per task) -> a token batch."""
        ...

    def loss(self, batch: TokenBatch, logprobs: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """``logprobs`` [B, L] under the current policy (with gradients) -> (scalar loss, metrics)."""
        ...


REGISTRY = PluginRegistry("agentkit.objectives", "objective")
for _name, _target, _about in [
    ("sft", "agentkit.objectives.sft:SFT", "negative log-likelihood of demonstration responses"),
    ("grpo", "agentkit.objectives.grpo:GRPO", "group-relative policy optimization (PPO clip, k3 KL)"),
]:
    REGISTRY.register(PluginSpec(_name, _target, description=_about))


def make_objective(name: str, args: dict[str, Any] | None = None) -> Objective:
    """Build objective ``name`` with settings ``args``, validating both."""
    spec, cls = REGISTRY.load(name)
    missing = [m for m in ("prepare", "loss") if not callable(getattr(cls, m, None))]
    config_cls = getattr(cls, "Config", None)
    if missing or not (isinstance(config_cls, type) and issubclass(config_cls, BaseModel)):
        what = f"no {', '.join(missing)} method" if missing else "no pydantic Config class"
        raise PluginError(
            f"Objective {name!r} from {spec.distribution!r} (group {REGISTRY.group!r}) resolved to {cls!r}, which has "
            f"{what}; an objective needs a pydantic `Config`, prepare(trajectories) and loss(batch, logprobs)."
        )
    try:
        config = config_cls(**(args or {}))
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors())
        raise ConfigError(
            f"Invalid settings for objective {name!r}: {problems}. Its settings are {sorted(config_cls.model_fields)}."
        ) from err
    return cls(config)


def describe() -> list[tuple[str, str, str]]:
    """(name, distribution, description) of every objective."""
    return [(s.name, s.distribution, s.description) for s in REGISTRY.specs()]
