"""The loop's scoring phase: the teacher and the turn judge, run without gradients.

Objectives declare what they need (``Capabilities``: a teacher, its top-k support, a judge) and
stay pure maths; this module builds the teacher and the judge from those declarations and, each
step, turns the step's trajectories into the ``StepScores`` that ``objective.prepare`` reads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from agentkit.core.errors import ConfigError
from agentkit.core.trajectory import Trajectory
from agentkit.objectives import Capabilities, StepScores, build_batch
from agentkit.teachers import Teacher, TurnJudge, make_judge, make_teacher


def build_teacher_and_judge(capabilities: Capabilities, *, teacher_spec: str | None, policy: Any, tokenizer: Any,
                            bank: Any = None, privileged: Sequence[str] | None = None,
                            objective: str = "the objective", dtype: torch.dtype = torch.float32,
                            device: str = "cpu", base: Any = None) -> tuple[Teacher | None, TurnJudge | None]:
    """The teacher (``teacher_spec``, else the objective's default) and the judge
    (``capabilities.judge``) an objective's resolved ``capabilities`` ask for; None for each it
    does not need.

    Args:
        capabilities: ``objective.requirements()`` (settings resolved: the judge kind, top-k).
        teacher_spec: ``--teacher`` (``self``, ``model:DIR``, a plugin), or None for the default.
        policy, tokenizer: the student (the ``self`` teacher is the policy itself).
        bank: the skill bank privileged skills are looked up in.
        privileged: the privileged sources shown to the teacher (None: the teacher's default).
        objective: the objective's name, for messages.
        dtype, device: where a teacher with weights of its own keeps them (``model:DIR``: frozen, so
            bf16 halves its memory; a device of its own for a teacher larger than the student).
        base: a LoRA policy's base model (``agentkit.train.lora.BaseView``, with its ``path``): a
            ``model:DIR`` teacher that is that folder scores with it, with no second copy.
    """
    teacher = None
    if capabilities.needs_teacher:
        spec = resolve_teacher_spec(choose_teacher(capabilities, teacher_spec, objective=objective))
        if base is not None and spec.startswith("model:") and Path(spec[6:]).resolve() == Path(base.path).resolve():
            # the LoRA policy's own base weights
            from agentkit.teachers import ModelTeacher

            teacher = ModelTeacher(base, tokenizer, name=spec, privileged=tuple(privileged or ()), bank=bank)
        else:
            teacher = make_teacher(spec, policy=policy, tokenizer=tokenizer, bank=bank, privileged=privileged,
                                   dtype=dtype, device=device)
        if capabilities.needs_support and capabilities.topk == 0 and not teacher.full_vocabulary:
            raise ConfigError(f"objective {objective!r} needs the teacher's whole distribution (topk 0: the exact "
                              f"reverse KL), and teacher {spec} gives its top k only (a server's prompt_logprobs): "
                              "set the objective's topk (--set objective.args.topk=20), or use a local teacher "
                              "(model:DIR, self).")
    judge = None
    if capabilities.needs_judge:
        judge = make_judge(capabilities.judge or "teacher", teacher, capabilities.judge_template, tokenizer=tokenizer)
    return teacher, judge


def choose_teacher(capabilities: Capabilities, given: str | None, *, objective: str = "the objective",
                   separate: Callable[[], str] | None = None) -> str | None:
    """The one place that decides which teacher a run scores with, from the objective's declared
    ``capabilities``: ``given`` (``--teacher``) when there is one; else None when the objective
    needs no teacher; else its declared ``default_teacher`` (``self``); else ``separate()``, a
    separate model made for the run (``agentkit train`` passes the default teacher of its
    environment, ``agentkit.train.default_teacher``); else a ConfigError saying what to pass."""
    if given or not capabilities.needs_teacher:
        return given
    if capabilities.default_teacher is not None:
        return capabilities.default_teacher
    if separate is None:
        raise ConfigError(f"objective {objective!r} distills from a separate teacher model: pass --teacher "
                          "model:DIR (teacher.spec), or --teacher self.")
    return separate()


def resolve_teacher_spec(spec: str) -> str:
    """``model:RUN_DIR`` / ``vllm:RUN_DIR`` name the run's newest checkpoint; a folder that is not
    there fails at once, naming it (never a hub lookup)."""
    from agentkit.models import resolve_model_dir
    from agentkit.teachers import split_spec

    name, arg = split_spec(spec)
    if name in ("model", "vllm") and arg:
        return f"{name}:{resolve_model_dir(arg, flag=f'--teacher {name}:')}"
    return spec


@torch.no_grad()
def score_step(capabilities: Capabilities, teacher: Teacher | None, judge: TurnJudge | None,
               trajectories: Sequence[Trajectory], *, step: int = 1) -> StepScores | None:
    """The teacher's scores of the step's response tokens (aligned with ``build_batch(trajectories)``,
    the layout every objective's batch shares) and the turn judgments, as ``capabilities`` asks,
    at the 1-based training ``step``; None when it asks for neither."""
    if not (capabilities.needs_teacher or capabilities.needs_judge):
        return None
    teacher_scores = judgments = None
    if capabilities.needs_teacher:
        if teacher is None:
            raise ConfigError("score_step(): the objective needs a teacher and none was built "
                              "(build_teacher_and_judge makes it).")
        topk = capabilities.topk if capabilities.needs_support else None
        teacher_scores = teacher.score(build_batch(trajectories), trajectories, topk=topk)
    if capabilities.needs_judge:
        if judge is None:
            raise ConfigError("score_step(): the objective needs a turn judge and none was built "
                              "(build_teacher_and_judge makes it).")
        judgments = judge.judge(trajectories)
    return StepScores(teacher=teacher_scores, judgments=judgments, step=step)
