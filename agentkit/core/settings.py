"""Every setting that more than one command has, defined once.

``rollout``, ``eval``, ``demos`` and ``train`` compose these models, so a setting has one name (its
``--set`` key), one flag, one default and one help text everywhere: the flags of every command
are generated from the models (``agentkit.core.config.add_settings_arguments``), and the settings
table in ``docs/settings.md`` is generated from them too (``python -m agentkit.settings_doc``).

Defaults that belong to an environment (its settings such as the coin level, a turn limit long
enough for its expert plans, its held-out split, its action format and system prompt) come from
its registration (``agentkit.envs.env_info``): the fields for them default to ``None`` here, which
means "the environment's own", and are filled in before a command runs (and recorded that way in a
run's ``config.yaml``).

A field's flag is ``--`` plus its name with dashes, unless the field declares another in
``json_schema_extra={"flag": ...}``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentkit.core.trajectory import ContextMode


class Settings(BaseModel):
    """Base of every settings model: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=(), validate_assignment=True)


def flag(name: str) -> dict[str, Any]:
    return {"flag": name}


# a setting that changes how a run is carried out, not what it computes: ``train --resume`` names it as
# ignored when given another value, where any other setting given another value is refused
RUNTIME = {"runtime": True}


def default(model: type[BaseModel], name: str) -> Any:
    """The default of setting ``name`` of ``model``: for the lower layers' own parameters, so
    that a library call without settings behaves as the commands' defaults do."""
    return model.model_fields[name].get_default(call_default_factory=True)


class EnvSettings(Settings):
    """Which environment and how its episodes run."""

    id: str = Field("textworld/coin-v0", json_schema_extra=flag("--env"),
                    description="Environment id (agentkit envs list).")
    kwargs: dict[str, Any] = Field(default_factory=dict, json_schema_extra=flag("--env-kwargs"),
                                   description="Environment settings over its registered defaults, e.g. level=5 "
                                               "(agentkit envs list shows each environment's).")
    max_turns: int | None = Field(None, gt=0, description="Turns per episode before truncation "
                                  "(default: the environment's, long enough for its expert plans).")
    workers: int = Field(0, ge=0, json_schema_extra=flag("--env-workers") | RUNTIME,
                         description="Environment worker processes, or Ray actors with --ray "
                                     "(0 = step the environments in this process).")
    ray: str | None = Field(None, json_schema_extra=RUNTIME, description="Run the environment workers as Ray actors on this cluster: auto "
                            "(a running cluster), host:port, ray://host:port, or local (start one here).")
    step_timeout: float = Field(120.0, gt=0, json_schema_extra=RUNTIME, description="Seconds an environment step may take before its worker "
                                "is restarted and the episode ended (with --env-workers >= 1).")
    reset_timeout: float = Field(300.0, gt=0, json_schema_extra=RUNTIME, description="Seconds an environment reset may take before its worker "
                                 "is restarted and the episode ended (with --env-workers >= 1). Longer than "
                                 "--step-timeout: a first reset may generate a game or start a JVM.")
    reset_ahead: bool = Field(True, json_schema_extra=RUNTIME,
                              description="With --env-workers >= 1, reset the next training step's first episodes "
                                          "in the workers while this step trains, not when the next step starts; "
                                          "the episodes are the same either way. Environments in this process "
                                          "reset when their episode starts.")
    max_observation_chars: int = Field(100_000, gt=0, description="The most characters one observation may add to "
                                       "the context (about 25k tokens); an episode whose environment returns a "
                                       "longer one ends there, truncated, with the reason recorded.")
    max_errors: int = Field(10, ge=0, json_schema_extra=flag("--max-env-errors") | RUNTIME,
                            description="Stop once this many episodes in a row end in an environment error (it "
                                        "raised, its worker died or hung) or an unusable model answer (NaN "
                                        "logprobs); each is recorded with its error. 0 = never stop.")

    @model_validator(mode="after")
    def _check(self) -> EnvSettings:
        if self.ray is not None and self.workers == 0:
            raise ValueError("env.ray (--ray) runs the environments in Ray actors, but env.workers (--env-workers) "
                             "is 0, which means in this process: set --env-workers N (N actors) or drop --ray.")
        return self


class GenerationSettings(Settings):
    """How long an answer may be (greedy evaluation has only this)."""

    max_new_tokens: int = Field(32, gt=0, description="Most tokens per response.")


class SamplingSettings(GenerationSettings):
    """How responses are sampled."""

    temperature: float = Field(1.0, ge=0, description="Sampling temperature (0 = greedy).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Sample among the k most likely tokens (0 = off).")


class ContextSettings(Settings):
    """What the model sees each turn."""

    mode: ContextMode = Field("chat", json_schema_extra=flag("--context"),
                                            description="chat: one growing conversation (token-exact); window: a "
                                                        "fresh prompt each turn with the task and the last turns.")
    window: int = Field(3, ge=0, description="Turns of history in window mode.")
    show_admissible: bool = Field(True, description="List the admissible actions in each observation.")
    system_prompt: str | None = Field(None, description="System prompt (default: the environment's action format "
                                      "instruction, e.g. answer inside <action></action>).")


class SkillSettings(Settings):
    """Skill banks: which bank, how skills are retrieved."""

    bank: str | None = Field(None, json_schema_extra=flag("--skills"),
                             description="Skill bank: a JSON/YAML file or a starter name (textworld, alfworld, ...). "
                                         "rollout/eval: the policy sees the retrieved skills only when one is given; "
                                         "train: default the environment family's starter bank for objectives that "
                                         "retrieve skills.")
    retrieval: str = Field("ucb", description="Retriever: ucb | keyword | full | random | a plugin.")
    k: int = Field(3, gt=0, json_schema_extra=flag("--skills-k"), description="Skills retrieved per episode.")
    args: dict[str, Any] = Field(default_factory=dict, json_schema_extra=flag("--retrieval-args"),
                                 description="The retriever's own settings (ucb: c).")


class OutputSettings(Settings):
    """What to do with an existing output file."""

    append: bool = Field(False, description="Append to an existing output file.")
    overwrite: bool = Field(False, description="Replace an existing output file (the old one stays until the new "
                            "one is complete).")

    @model_validator(mode="after")
    def _check_output(self) -> OutputSettings:
        if self.append and self.overwrite:
            raise ValueError("--append and --overwrite exclude each other; pick one.")
        return self
