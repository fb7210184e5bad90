"""Settings of ``agentkit train``: a YAML file plus dotted overrides (``--set train.lr=1e-5``).

Every field's description is its documentation (``agentkit train --help-config`` prints them).
Unknown keys are errors with a "did you mean"; cross-field checks say what to change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentkit.core.config import parse_assignment, read_yaml
from agentkit.core.errors import ConfigError, did_you_mean


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class EnvSection(_Section):
    id: str = Field("textworld/coin-v0", description="Environment id (agentkit envs list).")
    kwargs: dict[str, Any] = Field(default_factory=lambda: {"level": 2}, description="Environment settings.")
    eval_split: str = Field("eval", description="Held-out split for periodic greedy evaluation.")
    max_turns: int = Field(8, gt=0, description="Turns per episode before truncation.")
    workers: int = Field(0, ge=0, description="Environment worker processes, or Ray actors with env.ray (0 = in the training process).")
    ray: str | None = Field(None, description="Run the environment workers as Ray actors on this cluster: auto, host:port, ray://host:port or local.")
    max_consecutive_errors: int = Field(10, ge=0, description="Stop the run once this many episodes in a row end in an environment error (it raised, its worker died or hung); each such episode is recorded with its error and the worker restarted. 0 = never stop.")


class RolloutSection(_Section):
    tasks_per_step: int = Field(4, gt=0, description="Tasks sampled per training step.")
    group_size: int = Field(4, gt=0, description="Episodes per task (GRPO groups).")
    context: Literal["chat", "window"] = Field("chat", description="Context mode of the rollouts.")
    window: int = Field(3, ge=0, description="History turns in window mode.")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    max_new_tokens: int = Field(24, gt=0, description="Most tokens per response.")
    show_admissible: bool = Field(True, description="List the admissible actions in observations.")
    backend: Literal["hf", "vllm"] = Field("hf", description="Generation backend: hf (transformers, shares the trained module) or vllm (in-process engine; weights synced after every update).")
    vllm: dict[str, Any] = Field(default_factory=dict, description="vllm.LLM settings with backend=vllm (gpu_memory_utilization, dtype, weight_sync=direct|ipc|file, kv_cache_gib, enable_sleep_mode, tensor_parallel_size...).")
    vllm_sleep: bool = Field(False, description="Put the vLLM engine to sleep during updates (GPU; needs vllm.enable_sleep_mode).")


class ObjectiveSection(_Section):
    name: str = Field("grpo", description="Objective (agentkit objectives list).")
    args: dict[str, Any] = Field(default_factory=dict, description="The objective's own settings.")


class TeacherSection(_Section):
    spec: str | None = Field(None, description="Teacher: self | model:DIR | a plugin (default: the objective's own).")
    privileged: list[Literal["skills", "env"]] | None = Field(
        None, description="Privileged context shown to the teacher (default: skills for self, none for model).")


class SkillsSection(_Section):
    bank: str | None = Field(None, description="Skill bank file or starter name (default: the env family's starter bank).")
    retrieval: str = Field("ucb", description="Retriever: ucb | keyword | full | random | a plugin.")
    k: int = Field(3, gt=0, description="Skills retrieved per episode.")
    args: dict[str, Any] = Field(default_factory=dict, description="The retriever's own settings (ucb: c).")


class TrainSection(_Section):
    steps: int = Field(20, gt=0, description="Training steps (one rollout batch each).")
    lr: float = Field(3e-4, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    grad_clip: float = Field(1.0, ge=0, description="Max global gradient norm (0 = off).")
    epochs: int = Field(1, gt=0, description="Passes over each step's batch.")
    minibatches: int = Field(1, gt=0, description="Optimizer steps per pass (the batch is split by episode).")
    micro_batch_tokens: int = Field(16384, gt=0, description="Padded tokens per forward/backward micro-batch.")
    demos: str | None = Field(None, description="Demonstrations JSONL (agentkit demos) for objectives that train on them.")
    demos_per_step: int = Field(16, gt=0, description="Demonstration episodes per step.")
    max_bad_updates: int = Field(3, ge=0, description="Stop the run after this many optimizer updates in a row had a NaN/inf loss or gradient (each is skipped, and counted as skipped_updates in metrics.jsonl). 0 = never stop.")


class EvalSection(_Section):
    every: int = Field(5, ge=0, description="Evaluate every N steps (0 = only at the end).")
    episodes: int = Field(16, gt=0, description="Greedy evaluation episodes (eval split seeds 0..N-1).")


class CheckpointSection(_Section):
    every: int = Field(5, ge=0, description="Checkpoint every N steps (0 = only at the end).")
    keep: int = Field(2, gt=0, description="Checkpoints kept (oldest removed).")


class LogSection(_Section):
    signal_episodes: int = Field(4, ge=0, description="Episodes per step whose per-token teacher signals (teacher logprob, teacher-student gap, top-1 confidence, SDAR gate, SAGE-OPD turn labels) go to RUN_DIR/signals/step-N.jsonl for agentkit view; the trajectory files stay as they are. 0 = none.")


class TrainConfig(_Section):
    model: str | None = Field(None, description="Policy model folder (default: the tiny default model).")
    out: str = Field("runs/train", description="Run folder.")
    seed: int = Field(0, ge=0, description="Seeds task sampling, sampling and initialization order.")
    env: EnvSection = Field(default_factory=EnvSection)
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    objective: ObjectiveSection = Field(default_factory=ObjectiveSection)
    teacher: TeacherSection = Field(default_factory=TeacherSection)
    skills: SkillsSection = Field(default_factory=SkillsSection)
    train: TrainSection = Field(default_factory=TrainSection)
    log: LogSection = Field(default_factory=LogSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)

    @model_validator(mode="after")
    def _cross_checks(self) -> TrainConfig:
        from agentkit.objectives import make_objective

        objective = make_objective(self.objective.name, self.objective.args)
        if objective.uses_demonstrations and not self.train.demos:
            raise ValueError(
                f"objective {self.objective.name!r} trains on demonstrations: set train.demos=FILE "
                "(make one with `agentkit demos --env ID --episodes N --out FILE`)."
            )
        from agentkit.objectives.grpo import GRPO

        if isinstance(objective, GRPO) and self.rollout.group_size < 2:
            raise ValueError(f"{self.objective.name} compares episodes within a group (GRPO): rollout.group_size must be >= 2.")
        if getattr(objective, "needs_teacher", False) and not (self.teacher.spec or getattr(objective, "default_teacher", None)):
            raise ValueError(f"objective {self.objective.name!r} distills from a separate teacher model: set "
                             "teacher.spec=model:DIR (--teacher model:DIR), or --teacher self.")
        from agentkit.skillbank.retrieval import REGISTRY as RETRIEVERS

        RETRIEVERS.spec(self.skills.retrieval)  # unknown name -> did you mean
        if self.env.ray and self.env.workers == 0:
            raise ValueError("env.ray runs environment workers as Ray actors: set env.workers to the number of actors (>= 1).")
        if self.rollout.vllm_sleep and not (self.rollout.backend == "vllm" and self.rollout.vllm.get("enable_sleep_mode")):
            raise ValueError("rollout.vllm_sleep needs rollout.backend=vllm and rollout.vllm.enable_sleep_mode=true.")
        if self.train.minibatches > self.rollout.tasks_per_step * self.rollout.group_size:
            raise ValueError("train.minibatches is larger than the number of episodes per step.")
        return self


def _set_dotted(data: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: {key!r} is not a section.")
    node[keys[-1]] = value


def _unknown_key_message(loc: tuple, model: type[BaseModel]) -> str:
    node: Any = model
    path = []
    for part in loc:
        fields = getattr(node, "model_fields", None)
        if fields is None:
            break
        if part not in fields:
            return f"unknown key {'.'.join([*path, str(part)])!r}.{did_you_mean(str(part), fields)} Known here: {sorted(fields)}"
        path.append(str(part))
        node = fields[part].annotation
    return f"unknown key {'.'.join(str(p) for p in loc)!r}"


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, **flags: Any) -> TrainConfig:
    """Build the config from a YAML file, then ``section.key=value`` overrides, then flags."""
    data: dict[str, Any] = {}
    if path is not None:
        loaded = read_yaml(path, what="config")  # problems name the file and line
        if not isinstance(loaded, dict):
            raise ConfigError(f"Config {path} must be a YAML mapping of sections, got {type(loaded).__name__}.")
        data = loaded
    for item in overrides or []:
        _set_dotted(data, *parse_assignment(item))
    for dotted, value in flags.items():
        if value is not None:
            _set_dotted(data, dotted, value)
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            if e["type"] == "extra_forbidden":
                problems.append(_unknown_key_message(tuple(e["loc"]), TrainConfig))
            else:
                loc = ".".join(str(p) for p in e["loc"])
                problems.append(f"{loc or 'config'}: {e['msg']}")
        raise ConfigError("Invalid training config:\n  " + "\n  ".join(problems)) from err
    except ConfigError:
        raise


def dump_config(config: TrainConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def describe_config(objective: str | None = None) -> str:
    """Every setting as ``section.key (type, default): description``; with ``objective``, its args too."""
    lines = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(annotation, f"{prefix}{name}.")
                continue
            default = field.get_default(call_default_factory=True)
            kind = getattr(annotation, "__name__", str(annotation)).replace("typing.", "")
            lines.append(f"  {prefix}{name} ({kind}, default {default!r}): {field.description or ''}")

    walk(TrainConfig, "")
    if objective:
        from agentkit.objectives.protocol import REGISTRY

        _, cls = REGISTRY.load(objective)
        lines.append(f"\nobjective.args for {objective!r}:")
        walk(cls.Config, "objective.args.")
    return "\n".join(lines)

