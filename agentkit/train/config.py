"""Settings of ``agentkit train``: a YAML file, dotted overrides (``--set train.lr=1e-5``), then flags.

The environment, sampling, context, skill and backend sections are the shared models of
``agentkit.core.settings`` (the same names and defaults as ``rollout``, ``eval`` and ``demos``).
Every field's description is its documentation (``agentkit train --help-config`` prints them);
every field has a flag. Unknown keys are errors with a "did you mean" (or the new name of a
renamed key); cross-field checks say what to change.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import Field, field_validator, model_validator

from agentkit.core.config import describe_settings, load_settings
from agentkit.core.errors import did_you_mean
from agentkit.core.settings import (
    RUNTIME,
    ContextSettings,
    EnvSettings,
    SamplingSettings,
    Settings,
    SkillSettings,
    flag,
)
from agentkit.rollout.backends import TrainBackendSettings, backend_default
from agentkit.rollout.config import MODEL_HELP

if TYPE_CHECKING:
    from agentkit.objectives import Capabilities, Objective


class RolloutSection(Settings):
    tasks_per_step: int = Field(4, gt=0, description="Tasks sampled per training step.")
    group_size: int = Field(4, gt=0, description="Episodes per task (GRPO groups).")


class ObjectiveSection(Settings):
    name: str = Field("grpo", json_schema_extra=flag("--objective"), description="Objective (agentkit objectives list).")
    args: dict[str, Any] = Field(default_factory=dict, json_schema_extra=flag("--objective-args"),
                                 description="The objective's own settings (agentkit train --help-config --objective NAME).")

    @field_validator("name")
    @classmethod
    def _registered_spelling(cls, value: str) -> str:
        """``sage-opd`` is ``sage_opd``: the name as registered (an unknown one is refused by the config's checks)."""
        from agentkit.core.errors import UnknownNameError
        from agentkit.objectives.protocol import REGISTRY

        try:
            return REGISTRY.spec(value).name
        except UnknownNameError:
            return value

    def build(self) -> Objective:
        """The objective these settings name, built with its ``args`` (validating both); cheap: an
        objective is pure maths."""
        from agentkit.objectives import make_objective

        return make_objective(self.name, self.args)

    def requirements(self) -> Capabilities:
        """What the objective needs from the loop (``agentkit.objectives.Capabilities``)."""
        return self.build().requirements()


class TeacherSection(Settings):
    spec: str | None = Field(None, json_schema_extra=flag("--teacher"),
                             description="Teacher for distillation objectives: self | model:DIR | vllm:DIR | "
                                         "openai:URL[#MODEL] | a plugin (default: the objective's own; for one "
                                         "that distills from a separate model, the default teacher of the "
                                         "environment, built on first use: agentkit.train.default_teacher).")
    privileged: list[Literal["skills", "env"]] | None = Field(
        None, json_schema_extra=flag("--teacher-privileged"),
        description="Privileged context shown to the teacher (default: skills for self, none for model).")
    device: str | None = Field(None, json_schema_extra=flag("--teacher-device") | RUNTIME,
                               description="Device of a model:DIR teacher, for example cuda:1 for a larger teacher on a "
                                           "GPU of its own (default: the policy's device).")


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraSection(Settings):
    rank: int = Field(0, ge=0, json_schema_extra=flag("--lora-rank"),
                      description="LoRA: train a low-rank adapter of this rank on the target layers instead of every "
                                  "weight (0 = off: full fine-tuning). Checkpoints then hold the adapter; eval and "
                                  "rollout load base + adapter. Needs peft: pip install 'agentkit[lora]'.")
    alpha: float = Field(16.0, gt=0, json_schema_extra=flag("--lora-alpha"),
                         description="LoRA: the adapter's output is scaled by alpha / rank.")
    dropout: float = Field(0.0, ge=0, lt=1, json_schema_extra=flag("--lora-dropout"),
                           description="LoRA: dropout on the adapter's input while training (0 keeps the trainer's "
                                       "logprobs equal to the sampler's before the first update).")
    target_modules: list[str] = Field(default_factory=lambda: list(LORA_TARGETS), json_schema_extra=flag("--lora-targets"),
                                      description="LoRA: names of the linear layers that get an adapter (default: "
                                                  "every attention and MLP projection of Qwen/Llama-style models).")


class TrainSection(Settings):
    steps: int = Field(20, gt=0, description="Training steps (one rollout batch each).")
    lr: float = Field(3e-4, gt=0, description="AdamW learning rate.")
    warmup_steps: int = Field(0, ge=0, description="Linear lr warmup: step s (from 0) trains at lr x min(1, (s + 1) / "
                              "warmup_steps); 0 = the constant lr from the first step. AdamW's first steps move every "
                              "weight by about lr whatever the gradient's size, so a noisy RL batch at full lr can break "
                              "a small policy in one step.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    grad_clip: float = Field(1.0, ge=0, description="Max global gradient norm (0 = off).")
    epochs: int = Field(1, gt=0, description="Passes over each step's batch.")
    minibatches: int = Field(1, gt=0, description="Optimizer steps per pass (the batch is split by episode).")
    micro_batch_tokens: int = Field(
        16384, gt=0, description="Padded tokens per forward/backward micro-batch. A longer row (a chat-mode episode is one "
        "row: its turns scored in one pass) is a micro-batch of its own, its activations growing with its length: "
        "train.gradient_checkpointing bounds them.")
    precision: Literal["fp32", "bf16"] = Field(
        "fp32", json_schema_extra=flag("--precision"),
        description="Numerics of the policy. bf16: mixed precision, the policy's forward and backward passes (and its "
        "sampling with the transformers backend) under bf16 autocast, with fp32 weights, gradients and AdamW state; "
        "the frozen models (the reference, a model:DIR teacher) are stored in bf16, half their memory. The engine of "
        "--backend vllm keeps its own dtype (backend.args.dtype).")
    gradient_checkpointing: bool = Field(
        False, json_schema_extra=flag("--gradient-checkpointing") | RUNTIME,
        description="Keep only each layer's input in the forward pass and recompute the rest in the backward pass: "
        "activation memory of a long episode falls from every layer's to one layer's, for about one more forward pass.")
    demos: str | None = Field(None, description="Demonstrations for objectives that train on them: a JSONL file (agentkit demos) or a dataset of trajectories (agentkit export: a Parquet file or folder, a save_to_disk folder). Default: the environment's expert games, recorded on first use (agentkit.train.default_teacher).")
    demos_per_step: int = Field(16, gt=0, description="Demonstration episodes per step.")
    old_logprobs: Literal["auto", "trainer", "sampler"] = Field(
        "auto", description="pi_old of the policy-gradient ratio. trainer: one no-gradient forward of the trained model per "
        "batch recomputes it under the trainer's numerics; the sampler's logprobs stay in the trajectories and "
        "train.is_correction corrects for the difference (mismatch_kl and the is_ratio tails go to metrics.jsonl). "
        "sampler: the logprobs recorded at sampling. auto: trainer when the sampler is not the trained module itself "
        "(--backend vllm, --async) or samples in bf16 (train.precision bf16: the cached decoding and the "
        "whole-sequence forward round differently), else sampler.")
    is_correction: Literal["none", "truncate", "mask"] = Field(
        "truncate", description="Importance correction for the sampler/trainer mismatch when pi_old comes from the trainer: "
        "each token's loss times r = pi_old/pi_sampler, truncated at train.is_cap (truncate), or r with the tokens whose r "
        "is outside [1/cap, cap] left out of the loss (mask); none measures the mismatch without correcting it.")
    is_cap: float = Field(2.0, gt=1, description="The cap of the importance ratio (train.is_correction).")
    lora: LoraSection = Field(default_factory=LoraSection)
    max_bad_updates: int = Field(3, ge=0, json_schema_extra=RUNTIME, description="Stop the run after this many optimizer updates in a row had a NaN/inf loss or gradient (each is skipped, and counted as skipped_updates in metrics.jsonl). 0 = never stop.")


class AsyncSection(Settings):
    enabled: bool = Field(False, json_schema_extra=flag("--async"),
                          description="Train while rollouts go on: a generator process keeps playing the next steps' "
                                      "episodes with the weights it has while the trainer updates; weights reach it "
                                      "after every update, between turns. Off: rollout and update take turns.")
    max_staleness: int = Field(1, ge=0, json_schema_extra=flag("--max-staleness"),
                               description="Async: the most policy versions an episode may start behind the trainer "
                                           "(step k's episodes start once the trainer has made k - max_staleness "
                                           "updates; later turns may use newer weights). 0 = no overlap.")
    generator_threads: int = Field(0, ge=0, json_schema_extra=RUNTIME,
                                   description="Async: torch threads of the generator process (0 = half the cores).")
    trainer_threads: int = Field(0, ge=0, json_schema_extra=RUNTIME,
                                 description="Async: torch threads of the trainer (0 = the cores the generator leaves).")


class EvalSection(Settings):
    every: int = Field(5, ge=0, json_schema_extra=flag("--eval-every"),
                       description="Evaluate every N steps (0 = only at the end).")
    episodes: int = Field(16, gt=0, json_schema_extra=flag("--eval-episodes"),
                          description="Greedy evaluation episodes (seeds 0..N-1 of the held-out split).")
    split: str | None = Field(None, json_schema_extra=flag("--eval-split"),
                              description="Held-out split for evaluation (default: the environment's).")
    at_start: bool = Field(True, json_schema_extra=flag("--eval-at-start"), description="Evaluate the starting policy too, before the first update (step 0 in "
                           "eval.jsonl), so that every run shows its success at the start beside the end's.")


class CheckpointSection(Settings):
    every: int = Field(5, ge=0, json_schema_extra=flag("--checkpoint-every") | RUNTIME,
                       description="Checkpoint every N steps (0 = only at the end).")
    keep: int = Field(2, gt=0, json_schema_extra=flag("--checkpoint-keep") | RUNTIME, description="Checkpoints kept (oldest removed).")


TRACKERS = Literal["tensorboard", "wandb", "mlflow"]


class LogSection(Settings):
    signal_episodes: int = Field(4, ge=0, json_schema_extra=RUNTIME, description="Episodes per step whose per-token teacher signals (teacher logprob, teacher-student gap, top-1 confidence, SDAR gate, SAGE-OPD turn labels) go to RUN_DIR/signals/step-N.jsonl for agentkit view; the trajectory files stay as they are. 0 = none.")
    report_to: list[TRACKERS] = Field(
        default_factory=list, json_schema_extra=flag("--report-to") | RUNTIME,
        description="Experiment trackers that get the metrics, eval results (under eval/), the config and a table of "
                    "a few episodes per step: any of tensorboard (RUN_DIR/tensorboard), wandb, mlflow, as words or a "
                    "comma list (none: no tracker). Each is an extra: pip install 'agentkit[wandb]'. Keys and "
                    "addresses come from the environment only (WANDB_API_KEY, WANDB_MODE, MLFLOW_TRACKING_URI, ...).")
    project: str | None = Field(None, json_schema_extra=RUNTIME,
                                description="W&B project and MLflow experiment of the run, whose name is the run "
                                            "folder's (default: WANDB_PROJECT / MLFLOW_EXPERIMENT_NAME, else agentkit).")
    table_episodes: int = Field(4, ge=0, json_schema_extra=RUNTIME,
                                description="Episodes per step in the trackers' episode table (id, task, prompt, "
                                            "response, reward, won, and the agentkit view command that opens it). 0 = no table.")

    @field_validator("report_to", mode="before")
    @classmethod
    def _words_or_commas(cls, value: Any) -> Any:
        """``tensorboard,wandb`` as well as a list; ``none`` means no tracker; each named once."""
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list):
            return value
        words = [w.strip() for item in items for w in (item.split(",") if isinstance(item, str) else [item])]
        known = typing.get_args(TRACKERS)
        for word in words:
            if word not in (*known, "", "none"):
                raise ValueError(f"{word!r} is not a tracker.{did_you_mean(str(word), known)} Known: {', '.join(known)}.")
        return list(dict.fromkeys(w for w in words if w not in ("", "none")))


class TrainConfig(Settings):
    model: str | None = Field(None, description=MODEL_HELP)
    out: str | None = Field(None, description="Run folder (default: a new runs/train-YYYYmmdd-HHMMSS, named at the start).")
    seed: int = Field(0, ge=0, description="Seeds task sampling, sampling and initialization order.")
    env: EnvSettings = Field(default_factory=EnvSettings)
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    sampling: SamplingSettings = Field(default_factory=SamplingSettings)
    context: ContextSettings = Field(default_factory=ContextSettings)
    backend: TrainBackendSettings = Field(default_factory=backend_default)
    objective: ObjectiveSection = Field(default_factory=ObjectiveSection)
    teacher: TeacherSection = Field(default_factory=TeacherSection)
    skills: SkillSettings = Field(default_factory=SkillSettings)
    train: TrainSection = Field(default_factory=TrainSection)
    async_rl: AsyncSection = Field(default_factory=AsyncSection)
    log: LogSection = Field(default_factory=LogSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)

    @model_validator(mode="after")
    def _cross_checks(self) -> TrainConfig:
        # unknown or invalid settings -> error; the needs under these settings (objectives are pure maths: cheap)
        # a teacher or demonstrations it needs and is not given are the run's defaults (agentkit.train.default_teacher)
        needs = self.objective.requirements()
        if needs.needs_groups and self.rollout.group_size < 2:
            raise ValueError(f"{self.objective.name} compares episodes within a group: rollout.group_size must be >= 2.")
        from agentkit.skillbank.retrieval import REGISTRY as RETRIEVERS

        RETRIEVERS.spec(self.skills.retrieval)  # unknown name -> did you mean
        if problem := self.backend.training_problem():
            raise ValueError(problem)
        if not needs.uses_demonstrations and (self.sampling.top_p < 1 or self.sampling.top_k > 0):
            raise ValueError(f"sampling.top_p={self.sampling.top_p}, sampling.top_k={self.sampling.top_k}: training "
                             "samples from the whole distribution at sampling.temperature (the trainer's logprobs, the "
                             "policy-gradient ratio and the teacher's scores are over the whole vocabulary; a "
                             "truncated sample has no such logprob). Drop --top-p/--top-k (or set 1 and 0).")
        if self.async_rl.enabled and needs.uses_demonstrations:
            raise ValueError(f"--async overlaps rollouts with updates; objective {self.objective.name!r} trains on "
                             "demonstrations and plays no rollouts. Drop --async.")
        if self.train.minibatches > self.rollout.tasks_per_step * self.rollout.group_size:
            raise ValueError("train.minibatches is larger than the number of episodes per step.")
        return self


# keys of configs written by agentkit before the settings were shared across commands
RENAMED = {
    "rollout.context": "context.mode", "rollout.window": "context.window",
    "rollout.show_admissible": "context.show_admissible", "rollout.temperature": "sampling.temperature",
    "rollout.top_p": "sampling.top_p", "rollout.max_new_tokens": "sampling.max_new_tokens",
    "rollout.backend": "backend.kind", "rollout.vllm": "backend.args", "rollout.vllm_sleep": "backend.sleep",
    "env.max_consecutive_errors": "env.max_errors", "env.eval_split": "eval.split",
}


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                values: dict[str, Any] | None = None) -> TrainConfig:
    """Build the config from a YAML file, then ``section.key=value`` overrides, then the flags given
    (``values``: dotted key -> value)."""
    return load_settings(TrainConfig, path, overrides, values, renamed=RENAMED, what="training config")


def dump_config(config: TrainConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def describe_config(objective: str | None = None) -> str:
    """Every setting as ``key (flag, default): description``; with ``objective``, its args too."""
    lines = describe_settings(TrainConfig)
    if objective:
        from agentkit.objectives.protocol import REGISTRY

        _, cls = REGISTRY.load(objective)
        lines.append(f"\nobjective.args for {objective!r} (--objective-args KEY=VALUE ...):")
        lines += describe_settings(cls.Config, "objective.args.", flags=False)
    return "\n".join(lines)
