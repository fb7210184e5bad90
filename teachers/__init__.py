"""agentkit.teachers: who scores the student's tokens (entry-point group ``agentkit.teachers``).

``--teacher self`` is the policy itself with privileged context; ``--teacher model:DIR`` a separate
Hugging Face folder; ``vllm:DIR`` the same served by vLLM; ``openai:URL[#MODEL]`` an
OpenAI-compatible server (vLLM) scoring with ``prompt_logprobs``. A plugin is a factory
``(arg, *, policy, tokenizer, bank, privileged, dtype, device) -> Teacher`` (``teachers.protocol``;
``dtype`` and ``device`` place weights of its own); what it returns is checked against the protocol
when it is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from agentkit.teachers.judge import LABELS, Judgments, LLMJudge, OracleJudge, TurnJudge, parse_label
from agentkit.teachers.model import ModelTeacher, check_same_tokenizer
from agentkit.teachers.protocol import MEMBERS, Teacher
from agentkit.teachers.scores import TeacherScores

from agentkit.core.errors import ConfigError, PluginError, did_you_mean
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


_EXPECTED = (f"a factory (arg, *, policy, tokenizer, bank, privileged, dtype, device) returning a Teacher "
             f"(agentkit.teachers.protocol: {', '.join(MEMBERS)})")


def make_teacher(spec: str, *, policy, tokenizer, bank=None, privileged: Sequence[str] | None = None,
                 dtype: torch.dtype = torch.float32, device: str = "cpu") -> Teacher:
    """Build the teacher ``spec`` for a student (``policy``, ``tokenizer``); ``dtype`` and ``device``
    place a teacher that loads weights of its own. The plugin and what it returns are checked
    against the ``Teacher`` protocol (PluginError naming the plugin)."""
    name, arg = split_spec(spec)
    plugin, factory = REGISTRY.load(name)
    where = f"Teacher {name!r} from {plugin.distribution!r} (group {REGISTRY.group!r})"
    if not callable(factory):
        raise PluginError(f"{where} resolved to {factory!r}, which is not callable; a teacher plugin is {_EXPECTED}.")
    kwargs: dict[str, Any] = {"policy": policy, "tokenizer": tokenizer, "bank": bank, "dtype": dtype, "device": device}
    if privileged is not None:
        kwargs["privileged"] = tuple(privileged)
    teacher = factory(arg, **kwargs) if arg is not None else factory(**kwargs)
    if not isinstance(teacher, Teacher):  # the protocol's members, checked once, when the plugin loads
        missing = [m for m in MEMBERS if not hasattr(teacher, m)]
        raise PluginError(f"{where} built {type(teacher).__name__!r}, which lacks {', '.join(missing)}; a teacher "
                          f"plugin is {_EXPECTED}.")
    return teacher


def make_judge(kind: str, teacher: Teacher | None = None, template: str | None = None, tokenizer=None) -> TurnJudge:
    """``teacher``: the teacher's weights answer a prompt; ``oracle``: the expert action decides;
    ``openai:URL[#MODEL]``: any OpenAI-compatible chat server answers (key from $OPENAI_API_KEY;
    the prompt is formatted with ``tokenizer``'s ChatML template, default the teacher's, and sent
    as messages)."""
    if kind == "oracle":
        return OracleJudge()
    if kind.startswith("openai:"):
        from agentkit.rollout.openai_backend import OpenAIBackend
        from agentkit.teachers.remote import split_url_model

        url, model = split_url_model(kind.removeprefix("openai:"))
        if tokenizer is None and teacher is not None:
            tokenizer = teacher.tokenizer
        if tokenizer is None:
            raise ConfigError("judge openai:URL needs a tokenizer to format its prompt (the student's).")
        return LLMJudge(OpenAIBackend(url, tokenizer, model=model, api="chat"), template)
    if kind == "teacher":
        backend = teacher.generation_backend() if teacher is not None else None
        if backend is None:
            raise ConfigError("judge 'teacher' needs a teacher that can generate; use judge=oracle or a model teacher.")
        return LLMJudge(backend, template)
    raise ConfigError(f"Unknown judge {kind!r}.{did_you_mean(kind, ['teacher', 'oracle'])} Choose teacher, oracle "
                      "or openai:URL[#MODEL].")


__all__ = ["REGISTRY", "Teacher", "make_teacher", "make_judge", "split_spec", "ModelTeacher", "TeacherScores",
           "check_same_tokenizer", "LLMJudge", "OracleJudge", "TurnJudge", "Judgments", "LABELS", "parse_label"]
