"""agentkit.teachers: who scores the student's tokens (entry-point group ``agentkit.teachers``).

``--teacher self`` is the policy itself with privileged context; ``--teacher model:DIR`` a separate
Hugging Face folder. A plugin is a factory ``(arg, *, policy, tokenizer, bank, privileged) -> teacher``
whose result has ``score(batch, trajectories, *, topk=None) -> TeacherScores``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentkit.teachers.judge import LABELS, Judgments, LLMJudge, OracleJudge, parse_label
from agentkit.teachers.model import ModelTeacher, check_same_tokenizer
from agentkit.teachers.scores import TeacherScores

from agentkit.core.plugins import PluginRegistry, PluginSpec

REGISTRY = PluginRegistry("agentkit.teachers", "teacher")
REGISTRY.register(PluginSpec("self", "agentkit.teachers.model:self_teacher",
                             description="the policy itself, with privileged context (skills, env info)"))
REGISTRY.register(PluginSpec("model", "agentkit.teachers.model:model_teacher",
                             description="a separate local Hugging Face model: model:DIR"))


def split_spec(spec: str) -> tuple[str, str | None]:
    """``"model:/runs/x"`` -> ("model", "/runs/x"); ``"self"`` -> ("self", None)."""
    name, sep, arg = spec.partition(":")
    if sep and name in REGISTRY.names():
        return name, arg
    return spec, None


def make_teacher(spec: str, *, policy, tokenizer, bank=None, privileged: Sequence[str] | None = None) -> Any:
    """Build the teacher ``spec`` for a student (``policy``, ``tokenizer``)."""
    name, arg = split_spec(spec)
    _, factory = REGISTRY.load(name)
    kwargs: dict[str, Any] = {"policy": policy, "tokenizer": tokenizer, "bank": bank}
    if privileged is not None:
        kwargs["privileged"] = tuple(privileged)
    return factory(arg, **kwargs) if arg is not None else factory(**kwargs)


def make_judge(kind: str, teacher=None, template: str | None = None):
    """``teacher``: the teacher's weights answer a prompt; ``oracle``: the expert action decides."""
    if kind == "oracle":
        return OracleJudge()
    if kind == "teacher":
        if teacher is None or not hasattr(teacher, "generation_backend"):
            from agentkit.core.errors import ConfigError

            raise ConfigError("judge 'teacher' needs a teacher that can generate; use judge=oracle or a model teacher.")
        return LLMJudge(teacher.generation_backend(), template)
    from agentkit.core.errors import ConfigError, did_you_mean

    raise ConfigError(f"Unknown judge {kind!r}.{did_you_mean(kind, ['teacher', 'oracle'])} Choose teacher or oracle.")


__all__ = ["REGISTRY", "make_teacher", "make_judge", "split_spec", "ModelTeacher", "TeacherScores",
           "check_same_tokenizer", "LLMJudge", "OracleJudge", "Judgments", "LABELS", "parse_label"]
