"""What a training step plays, for the training loop and the async generator alike (``agentkit.train``
and ``agentkit.train.async_rollout`` import this; it imports neither): the step's tasks, its sampling seed,
and the skills each episode sees.

Every one is a function of (seed, step) and the settings, so a resumed run, or the generator
process, plays what the uninterrupted synchronous run would have.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentkit.core import runs
from agentkit.core.errors import ConfigError
from agentkit.objectives import Capabilities
from agentkit.rollout.collector import EpisodeSpec
from agentkit.train.config import RolloutSection, TrainConfig


def step_tasks(rollout: RolloutSection, step: int) -> range:
    """The task seeds step ``step`` (from 0) plays: the next ``tasks_per_step`` of the train split."""
    first = step * rollout.tasks_per_step
    return range(first, first + rollout.tasks_per_step)


def run_tasks(rollout: RolloutSection, steps: int) -> range:
    """The task seeds the first ``steps`` steps play, all together."""
    return range(step_tasks(rollout, steps).start)


def episode_specs(rollout: RolloutSection, tasks: Iterable[int]) -> list[EpisodeSpec]:
    """The episodes of ``tasks``: ``group_size`` samples of each, a task's together."""
    return [EpisodeSpec(task, sample) for task in tasks for sample in range(rollout.group_size)]


def sampling_seed(seed: int, step: int) -> int:
    """The sampling seed of step ``step``'s episodes (each row's sample seed derives from it, the task
    seed, the sample and the turn) and of the skills they are shown."""
    return seed * 1_000_003 + step


def uses_skills(cfg: TrainConfig, needs: Capabilities) -> bool:
    """Whether the run retrieves skills: its objective does, or a bank is given."""
    return needs.uses_skills or bool(cfg.skills.bank)


def load_skill_bank(cfg: TrainConfig, run_dir: Path, saved: dict[str, Any] | None):
    """The run's skill bank: the checkpoint's copy on resume, else the configured (or starter) bank.
    The run keeps its own copy (``runs.skill_bank_file``); the source file is never modified."""
    from agentkit.skillbank import Skill, SkillBank, default_bank_for, resolve_bank

    if saved is not None:
        return SkillBank([Skill.model_validate(s) for s in saved["skills"]], episodes=saved["episodes"],
                         path=runs.skill_bank_file(run_dir))
    name = cfg.skills.bank or default_bank_for(cfg.env.id)
    if name is None:
        raise ConfigError(f"objective {cfg.objective.name!r} retrieves skills, and there is no starter bank for "
                          f"{cfg.env.id}: pass --skills BANK (a JSON or YAML skill bank).")
    bank = SkillBank.load(resolve_bank(name))
    bank.path = runs.skill_bank_file(run_dir)
    return bank


def skill_selector(cfg: TrainConfig, bank, retriever, seed: int, *, sees: bool):
    """The skills each episode sees, retrieved from ``bank`` (None: the run retrieves none, and so
    no selector) and, with ``sees``, shown to the policy too."""
    if bank is None:
        return None
    from agentkit.skillbank import make_selector

    return make_selector(bank, cfg.skills, env_id=cfg.env.id, seed=seed, show_policy=sees, retriever=retriever)
