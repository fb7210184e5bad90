"""Settings of ``agentkit rollout``, ``eval`` and ``demos``: the shared models of
``agentkit.core.settings`` plus each command's own few fields. Every field's description is its
``--help`` text; the flags are generated from these models."""

from __future__ import annotations

from agentkit.rollout.backends import BackendSettings, backend_default
from pydantic import Field, model_validator

from agentkit.core.settings import (
    ContextSettings,
    EnvSettings,
    GenerationSettings,
    OutputSettings,
    SamplingSettings,
    Settings,
    SkillSettings,
)

MODEL_HELP = ("Policy model folder (Hugging Face format), or a run folder of agentkit train (its newest checkpoint). "
              "Default: the tiny model shipped with agentkit.")
SEED_HELP = "First task seed (tasks are seed..seed+episodes-1); also seeds sampling."


class RolloutConfig(OutputSettings):
    """``agentkit rollout``: play episodes with a policy and write trajectories."""

    model: str | None = Field(None, description=MODEL_HELP)
    out: str | None = Field(None, description="Output JSONL file. Default: runs/rollout-<time>.jsonl.")
    seed: int = Field(0, ge=0, description=SEED_HELP)
    episodes: int = Field(8, gt=0, description="Number of tasks to play.")
    group_size: int = Field(1, gt=0, description="Times each task is played; the copies share a `group`.")
    split: str = Field("train", description="Task split to play (train, or the environment's held-out split).")
    max_in_flight: int = Field(0, ge=0, description="Episodes played at once (0 = all, at most 256: a larger count streams through).")
    resume: bool = Field(False, description="Complete an interrupted rollout: --out is the file it was writing; "
                         "episodes already there are kept (a torn last line goes to FILE.torn), the rest are played "
                         "and appended. The other flags must match the interrupted command (checked against the file).")
    env: EnvSettings = Field(default_factory=EnvSettings)
    sampling: SamplingSettings = Field(default_factory=SamplingSettings)
    context: ContextSettings = Field(default_factory=ContextSettings)
    skills: SkillSettings = Field(default_factory=SkillSettings)
    backend: BackendSettings = Field(default_factory=backend_default)

    @model_validator(mode="after")
    def _check(self) -> RolloutConfig:
        if self.resume and self.overwrite:
            raise ValueError("--resume completes the episodes missing from --out, --overwrite replaces the file; pick one.")
        if self.resume and not self.out:
            raise ValueError("--resume needs --out FILE: the output file of the interrupted rollout.")
        return self


class EvalConfig(OutputSettings):
    """``agentkit eval``: greedy episodes on a held-out split; the policy's context settings must be
    the ones it was trained with (``--context``, ``--window``, ``--max-new-tokens``...)."""

    model: str | None = Field(None, description=MODEL_HELP)
    out: str | None = Field(None, description="Also write the trajectories to this JSONL file.")
    seed: int = Field(0, ge=0, description="First task seed (tasks are seed..seed+episodes-1).")
    episodes: int = Field(32, gt=0, description="Number of tasks to play.")
    samples: int = Field(1, gt=0, description="Episodes per task: 1 plays each task once, greedily; n > 1 samples n "
                                              "episodes per task at temperature 1 and reports pass@k (k = 1, 2, 4, ..., n).")
    report: str | None = Field(None, description="Write the evaluation's figures (success with its 95% interval, "
                                                 "pass@k, per task type) to this JSON file.")
    split: str | None = Field(None, description="Split to evaluate on (default: the environment's held-out split).")
    compare: list[str] = Field(default_factory=list, description=(
        "Two models A B (run folders, checkpoints or model folders) instead of --model: both play the same tasks "
        "and seeds, and the report gives the paired difference of success A - B with its 95% interval."))
    env: EnvSettings = Field(default_factory=EnvSettings)
    sampling: GenerationSettings = Field(default_factory=GenerationSettings)
    context: ContextSettings = Field(default_factory=ContextSettings)
    skills: SkillSettings = Field(default_factory=SkillSettings)
    backend: BackendSettings = Field(default_factory=backend_default)

    @model_validator(mode="after")
    def _two_to_compare(self) -> EvalConfig:
        if self.compare and len(self.compare) != 2:
            raise ValueError(f"compare takes two models, A and B, got {len(self.compare)}: write --compare RUN_A RUN_B")
        if self.compare and self.model:
            raise ValueError("give either --model or --compare A B, not both (--compare plays both models)")
        if self.compare and self.out:
            raise ValueError("--out holds one model's trajectories; with --compare, write the figures with --report FILE "
                             "(or run eval --model A --out ... and eval --model B --out ... on the same --seed)")
        return self


class DemosConfig(OutputSettings):
    """``agentkit demos``: the environment's expert plans written as trajectories (for SFT)."""

    model: str | None = Field(None, description="Tokenize with this model's tokenizer. " + MODEL_HELP.split(". ", 1)[1])
    out: str = Field(..., description="Output JSONL file.")
    seed: int = Field(0, ge=0, description="First task seed (tasks are seed..seed+episodes-1).")
    episodes: int = Field(64, gt=0, description="Number of tasks to demonstrate.")
    split: str = Field("train", description="Task split to demonstrate.")
    env: EnvSettings = Field(default_factory=EnvSettings)
    context: ContextSettings = Field(default_factory=ContextSettings)


__all__ = ["DemosConfig", "EvalConfig", "RolloutConfig", "Settings"]
