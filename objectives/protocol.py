"""The objective protocol, its declared capabilities, and the registry of objectives
(entry-point group ``agentkit.objectives``).

An objective is a class with a pydantic ``Config`` (its fields are the objective's settings, set
with ``--set objective.args.NAME=VALUE``), a class-level ``capabilities`` (what the loop must
provide: a teacher, skills, groups, a judge, ...), and two methods: ``prepare`` turns trajectories
and the loop's scores into a ``TokenBatch`` (advantages, weights, masks), ``loss`` turns a batch
and the policy's logprobs into (loss, metrics). The loop reads the declarations and never looks at
an objective's name; it runs the teacher and the judge itself (``agentkit.train.scoring``), so an
objective is pure tensor maths.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from agentkit.objectives.batch import TokenBatch
from agentkit.objectives.scores import StepScores
from pydantic import BaseModel, ValidationError

from agentkit.core.errors import ConfigError, PluginError
from agentkit.core.plugins import PluginRegistry, PluginSpec
from agentkit.core.trajectory import Trajectory


@dataclass(frozen=True)
class Capabilities:
    """What an objective needs from the loop, declared at class level (``capabilities_of(name)``
    reads it without building the objective). Where one of the objective's settings changes a
    need, ``requirements()`` returns the resolved copy; at class level such a field says whether
    some setting can need it.

    Attributes:
        needs_teacher: ``prepare`` reads the teacher's per-token scores (``StepScores.teacher``).
        default_teacher: the teacher used when ``--teacher`` is not given ("self"), or None (the
            user must name one).
        uses_skills: episodes get skills from the skill bank (recorded in trajectories).
        policy_sees_skills: the skills go into the policy's own prompt (train and eval), and UCB
            retrieval credits them with the episode's return; otherwise only a teacher sees them
            and they are credited with how the teacher's lift agrees with the outcome
            (``agentkit.train.skill_credit``).
        needs_support: the teacher also returns its distribution over a support (``topk``) and
            ``loss(batch, logprobs, support)`` takes the policy's log-probs there: [N, K], the
            rows of ``x[batch.response_mask > 0]`` (see ``policy_logprobs(..., support=True)``).
        topk: with ``needs_support``: 0 = the whole vocabulary, k = the teacher's top k.
        needs_groups: compares the episodes of a task's group (``rollout.group_size >= 2``).
        needs_judge: ``prepare`` reads turn judgments (``StepScores.judgments``).
        judge: with ``needs_judge``: who labels turns, ``teacher`` | ``oracle`` | ``openai:URL[#MODEL]``.
        judge_template: the judge's prompt template file (None: the shipped one).
        needs_reference: the loop fills ``batch.ref_logprobs`` from a frozen reference model.
        uses_demonstrations: trains on expert demonstrations (``train.demos``) instead of rollouts.
    """

    needs_teacher: bool = False
    default_teacher: str | None = None
    uses_skills: bool = False
    policy_sees_skills: bool = False
    needs_support: bool = False
    topk: int | None = None
    needs_groups: bool = False
    needs_judge: bool = False
    judge: str | None = None
    judge_template: str | None = None
    needs_reference: bool = False
    uses_demonstrations: bool = False

    def __post_init__(self) -> None:
        if self.default_teacher is not None and not self.needs_teacher:
            raise ValueError("Capabilities: default_teacher is set but needs_teacher is False.")
        if self.policy_sees_skills and not self.uses_skills:
            raise ValueError("Capabilities: policy_sees_skills needs uses_skills.")
        if self.topk is not None and (not self.needs_support or self.topk < 0):
            raise ValueError("Capabilities: topk (>= 0) goes with needs_support.")
        if self.judge is not None and not self.needs_judge:
            raise ValueError("Capabilities: judge is set but needs_judge is False.")


@runtime_checkable
class Objective(Protocol):
    """A loss plugin.

    Attributes:
        capabilities: what the loop must provide (class level; see ``Capabilities``).
        Config: the pydantic model of its settings (unknown keys are errors).
        config: this instance's settings.
    """

    capabilities: ClassVar[Capabilities]
    Config: ClassVar[type[BaseModel]]
    config: BaseModel

    def requirements(self) -> Capabilities:
        """``capabilities`` resolved under this instance's settings (e.g. a KL coefficient of 0
        needs no reference model); objectives whose needs never depend on a setting return
        ``self.capabilities``."""
        ...

    def prepare(self, trajectories: Sequence[Trajectory], scores: StepScores | None = None) -> TokenBatch:
        """Trajectories of one step (groups of G samples per task) and the loop's teacher scores and
        turn judgments (None when the objective needs neither) -> a token batch. No model runs here."""
        ...

    def loss(self, batch: TokenBatch, logprobs: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """``logprobs`` [B, L] under the current policy (with gradients) -> (scalar loss, metrics).
        With ``needs_support`` the loop passes the support log-probs as a third argument."""
        ...


REGISTRY = PluginRegistry("agentkit.objectives", "objective")
for _name, _target, _about in [
    ("sft", "agentkit.objectives.sft:SFT", "negative log-likelihood of demonstration responses"),
    ("grpo", "agentkit.objectives.grpo:GRPO", "group-relative policy optimization (PPO clip, k3 KL)"),
    ("opd", "agentkit.objectives.opd:OPD", "on-policy distillation from a teacher model (sampled or full KL)"),
    ("opsd", "agentkit.objectives.opsd:OPSD", "on-policy self-distillation as in the SDAR paper (SDAR's gated term, no GRPO)"),
    ("opsd_rkl", "agentkit.objectives.opsd:OPSDRKL", "on-policy self-distillation, reverse KL to the privileged self-teacher"),
    ("grpo_opsd", "agentkit.objectives.grpo_opsd:GRPOOPSD", "GRPO + flat-gated self-distillation (the SDAR paper's, beta = 0)"),
    ("grpo_opsd_rkl", "agentkit.objectives.grpo_opsd:GRPOOPSDRKL", "GRPO + reverse-KL self-distillation (naive hybrid)"),
    ("sdar", "agentkit.objectives.sdar:SDAR", "GRPO + gated self-distillation (sigmoid of teacher-student gap)"),
    ("sage_opd", "agentkit.objectives.sage_opd:SAGEOPD", "turn-level judged, confidence-weighted OPD"),
    ("rlsd", "agentkit.objectives.rlsd:RLSD", "GRPO with teacher-reweighted token advantages"),
    ("skill_sd", "agentkit.objectives.skill_sd:SkillSD", "GRPO + importance-weighted k3 to the skill teacher"),
    ("skill_grpo", "agentkit.objectives.skill_grpo:SkillGRPO", "GRPO with retrieved skills in the policy's prompt"),
]:
    REGISTRY.register(PluginSpec(_name, _target, description=_about))

_EXPECTED = ("a class with `capabilities: ClassVar[Capabilities]` (agentkit.objectives.Capabilities), a pydantic "
             "`Config`, and the methods requirements(), prepare(trajectories, scores) and loss(batch, logprobs)")


def load_objective(name: str) -> type[Objective]:
    """The class registered as ``name``, checked against the protocol (PluginError naming the
    plugin, its distribution, the group and what was expected)."""
    spec, cls = REGISTRY.load(name)
    if not isinstance(cls, type):
        problems = [f"is a {type(cls).__name__}, not a class"]
    else:
        config_cls = inspect.getattr_static(cls, "Config", None)
        problems = []
        if not isinstance(inspect.getattr_static(cls, "capabilities", None), Capabilities):
            problems.append("has no `capabilities` (a Capabilities)")
        if not (isinstance(config_cls, type) and issubclass(config_cls, BaseModel)):
            problems.append("has no pydantic `Config` class")
        problems += [f"has no {m}() method" for m in ("requirements", "prepare", "loss")
                     if not callable(inspect.getattr_static(cls, m, None))]
    if problems:
        raise PluginError(
            f"Objective {name!r} from {spec.distribution!r} (group {REGISTRY.group!r}) resolved to {cls!r}, which "
            f"{', '.join(problems)}; an objective is {_EXPECTED}."
        )
    return cls


def capabilities_of(name: str) -> Capabilities:
    """The class-level capabilities of objective ``name``, without building it."""
    return load_objective(name).capabilities


def objective_config(name: str, args: dict[str, Any] | None = None) -> BaseModel:
    """Objective ``name``'s settings ``args``, validated (ConfigError listing its settings)."""
    config_cls = load_objective(name).Config
    try:
        return config_cls(**(args or {}))
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors())
        raise ConfigError(
            f"Invalid settings for objective {name!r}: {problems}. Its settings are {sorted(config_cls.model_fields)}."
        ) from err


def make_objective(name: str, args: dict[str, Any] | None = None) -> Objective:
    """Build objective ``name`` with settings ``args``, validating both."""
    return load_objective(name)(objective_config(name, args))


def describe() -> list[tuple[str, str, str]]:
    """(name, distribution, description) of every objective."""
    return [(s.name, s.distribution, s.description) for s in REGISTRY.specs()]
