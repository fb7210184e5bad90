"""agentkit.teachers: who scores the student's tokens (entry-point group ``agentkit.teachers``).

``--teacher self`` is the policy itself with privileged context; ``--teacher model:DIR`` a separate
Hugging Face folder; ``vllm:DIR`` the same served by vLLM; ``openai:URL[#MODEL]`` an
OpenAI-compatible server (vLLM) scoring with ``prompt_logprobs``. A plugin is a factory ``(arg, *, policy, tokenizer, bank, privileged) -> teacher``
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
REGISTRY.register(PluginSpec("vllm", "agentkit.teachers.remote:vllm_teacher",
                             description="a model folder served by vLLM in this process (prompt_logprobs): vllm:DIR"))
REGISTRY.register(PluginSpec("openai", "agentkit.teachers.remote:openai_teacher",
                             description="an OpenAI-compatible server with prompt_logprobs: openai:URL[#MODEL]"))


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


def make_judge(kind: str, teacher=None, template: str | None = None, tokenizer=None):
    """``teacher``: the teacher's weights answer a prompt; ``oracle``: the expert action decides;
    ``openai:URL[#MODEL]``: any OpenAI-compatible chat server answers (key from $OPENAI_API_KEY;
    the prompt is formatted with ``tokenizer``'s ChatML template and sent as messages)."""
    if kind == "oracle":
        return OracleJudge()
    if kind.startswith("openai:"):
        from agentkit.rollout.openai_backend import OpenAIBackend
        from agentkit.teachers.remote import split_url_model

        url, model = split_url_model(kind.removeprefix("openai:"))
        tokenizer = tokenizer if tokenizer is not None else getattr(teacher, "tokenizer", None)
        if tokenizer is None:
            from agentkit.core.errors import ConfigError

            raise ConfigError("judge openai:URL needs a tokenizer to format its prompt (the student's).")
        return LLMJudge(OpenAIBackend(url, tokenizer, model=model, api="chat"), template)
    if kind == "teacher":
        if teacher is None or not hasattr(teacher, "generation_backend"):
            from agentkit.core.errors import ConfigError

            raise ConfigError("judge 'teacher' needs a teacher that can generate; use judge=oracle or a model teacher.")
        return LLMJudge(teacher.generation_backend(), template)
    from agentkit.core.errors import ConfigError, did_you_mean

    raise ConfigError(f"Unknown judge {kind!r}.{did_you_mean(kind, ['teacher', 'oracle'])} Choose teacher, oracle "
                      "or openai:URL[#MODEL].")


__all__ = ["REGISTRY", "make_teacher", "make_judge", "split_spec", "ModelTeacher", "TeacherScores",
           "check_same_tokenizer", "LLMJudge", "OracleJudge", "Judgments", "LABELS", "parse_label"]
