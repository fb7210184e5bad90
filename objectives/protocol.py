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

    Optional attributes (the loop reads them with defaults of False/None):
        needs_teacher: ``prepare`` asks a teacher (the constructor's ``teacher=``) for token scores.
        default_teacher: the teacher used when ``--teacher`` is not given ("self"), or None.
        uses_skills: episodes get skills from the skill bank (recorded in trajectories).
        policy_sees_skills: the skills go into the policy's own prompt (train and eval).
        needs_support: ``loss(batch, logprobs, support)`` also takes the policy's log-probs over
            the teacher's top-k (or the whole vocabulary) at the response positions: [N, K], the
            rows of ``x[batch.response_mask > 0]`` (see ``policy_logprobs``).
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
    ("opd", "agentkit.objectives.opd:OPD", "on-policy distillation from a teacher model (sampled or full KL)"),
    ("opsd", "agentkit.objectives.opsd:OPSD", "on-policy self-distillation (policy + privileged context)"),
    ("grpo_opsd", "agentkit.objectives.grpo_opsd:GRPOOPSD", "GRPO + ungated self-distillation (naive hybrid)"),
    ("sdar", "agentkit.objectives.sdar:SDAR", "GRPO + gated self-distillation (sigmoid of teacher-student gap)"),
    ("sage_opd", "agentkit.objectives.sage_opd:SAGEOPD", "turn-level judged, confidence-weighted OPD"),
    ("rlsd", "agentkit.objectives.rlsd:RLSD", "GRPO with teacher-reweighted token advantages"),
    ("skill_sd", "agentkit.objectives.skill_sd:SkillSD", "GRPO + importance-weighted k3 to the skill teacher"),
    ("skill_grpo", "agentkit.objectives.skill_grpo:SkillGRPO", "GRPO with retrieved skills in the policy's prompt"),
]:
    REGISTRY.register(PluginSpec(_name, _target, description=_about))


def make_objective(name: str, args: dict[str, Any] | None = None, **resources: Any) -> Objective:
    """Build objective ``name`` with settings ``args``, validating both.

    ``resources`` (``teacher=``, ``judge=``) go to objectives whose constructor takes them.
    """
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
    import inspect

    accepted = inspect.signature(cls).parameters
    return cls(config, **{k: v for k, v in resources.items() if k in accepted and v is not None})


def describe() -> list[tuple[str, str, str]]:
    """(name, distribution, description) of every objective."""
    return [(s.name, s.distribution, s.description) for s in REGISTRY.specs()]
