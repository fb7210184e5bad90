"""Teachers served by an inference engine: ``vllm:DIR`` (vLLM in this process) and
``openai:URL[#MODEL]`` (any OpenAI-compatible server that returns ``prompt_logprobs``, e.g. vLLM).

Both score the student's tokens through ``prompt_logprobs``: the privileged block and the
student's ids go in as one prompt (one per block, ``teachers.context.teacher_sequences``), and the
engine returns, per position, the log-prob of the actual token and of its top-k alternatives (rank
1 = the teacher's top-1). The full-vocabulary distribution is not available this way (engines cap
k, vLLM at ``max_logprobs``): full-vocabulary OPD needs a local teacher (``self`` or ``model:DIR``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from agentkit.skillbank.bank import SkillBank
from agentkit.teachers.context import SOURCES, teacher_sequences
from agentkit.teachers.scores import TeacherScores

from agentkit.core.errors import ConfigError
from agentkit.core.trajectory import Trajectory


class PromptLogprobTeacher:
    """Scores student tokens with a backend's ``prompt_logprobs(sequences, topk)``.

    Args:
        backend: a ``VLLMBackend`` or ``OpenAIBackend`` (anything with ``prompt_logprobs`` and
            ``generate``).
        tokenizer: the tokenizer the privileged block is encoded with (the student's).
        name: for messages and metrics.
        privileged: privileged sources shown to the teacher ("skills", "env").
        bank: where retrieved skill ids are looked up.
    """

    def __init__(self, backend: Any, tokenizer: Any, *, name: str, privileged: Sequence[str] = (),
                 bank: SkillBank | None = None) -> None:
        unknown = [p for p in privileged if p not in SOURCES]
        if unknown:
            raise ConfigError(f"Unknown privileged source(s) {unknown}; choose from {list(SOURCES)}.")
        self.backend, self.tokenizer, self.name = backend, tokenizer, name
        self.privileged, self.bank = tuple(privileged), bank

    full_vocabulary = False  # prompt_logprobs: the top k only

    def score(self, batch, trajectories: Sequence[Trajectory], *, topk: int | None = None) -> TeacherScores:
        if topk == 0:
            raise ConfigError(f"Teacher {self.name} scores through prompt_logprobs, which return the top-k only: "
                              "set the objective's topk > 0, or use a local teacher (self, model:DIR) for the full "
                              "vocabulary.")
        if batch.temperature is not None and bool((batch.temperature != 1).any()):
            raise ConfigError(f"Teacher {self.name} scores through the server's prompt_logprobs, which are at "
                              f"temperature 1, and these episodes were sampled at {sorted(set(batch.temperature.tolist()))}: "
                              "train at sampling.temperature=1 (--temperature 1), or use a local teacher (self, model:DIR), "
                              "which scores at the sampling temperature.")
        k = max(1, topk or 1)
        sequences = teacher_sequences(batch, trajectories, self.privileged, self.bank, self.tokenizer)
        rows, length = batch.num_rows, batch.response_mask.shape[1]
        seqs = [s.prefix + batch.input_ids[s.row, : s.length].tolist() for s in sequences]
        scored = self.backend.prompt_logprobs(seqs, k)  # [sequence][position] -> {id: (logprob, rank)}
        out_lp = torch.zeros((rows, length))
        out_top1 = torch.zeros((rows, length))
        support_ids = torch.zeros((rows, length, k), dtype=torch.long) if topk else None
        support_lp = torch.full((rows, length, k), -1e9) if topk else None
        mask = batch.response_mask
        for seq, positions in zip(sequences, scored, strict=True):
            r, p = seq.row, len(seq.prefix)
            for t in seq.columns:
                # batch column t predicts input_ids[r, t+1], which sits at p+t+1 in the teacher's prompt
                entry = positions[p + t + 1]
                target = int(batch.input_ids[r, t + 1])
                out_lp[r, t] = entry[target][0]
                ranked = sorted((v for v in entry.items() if 0 < v[1][1] <= k), key=lambda v: v[1][1])
                out_top1[r, t] = ranked[0][1][0] if ranked else max(lp for lp, _ in entry.values())
                if support_ids is not None:
                    for j, (token, (lp, _)) in enumerate(ranked[:k]):
                        support_ids[r, t, j], support_lp[r, t, j] = token, lp
        if support_lp is not None:
            support_lp = support_lp * mask[..., None]
        return TeacherScores(logprobs=out_lp * mask, top1=out_top1 * mask, support_ids=support_ids,
                             support_logprobs=support_lp)

    def generation_backend(self, seed: int = 0):
        """The same engine, for the turn judge."""
        return self.backend


def vllm_teacher(arg: str | None = None, *, tokenizer, bank: SkillBank | None = None,
                 privileged: Sequence[str] = (), **_: Any) -> PromptLogprobTeacher:
    """A model folder served by an in-process vLLM engine: ``vllm:DIR``."""
    from agentkit.rollout.hf_backend import load_tokenizer
    from agentkit.rollout.vllm_backend import VLLMBackend
    from agentkit.teachers.model import check_same_tokenizer

    if not arg:
        raise ConfigError("The `vllm` teacher needs a folder: --teacher vllm:DIR (a Hugging Face model folder).")
    teacher_tokenizer = load_tokenizer(arg)
    check_same_tokenizer(tokenizer, teacher_tokenizer, arg)
    backend = VLLMBackend(arg, teacher_tokenizer, weight_sync="direct")
    return PromptLogprobTeacher(backend, tokenizer, name=f"vllm:{arg}", privileged=privileged, bank=bank)


def split_url_model(arg: str) -> tuple[str, str | None]:
    """``"http://h:8000/v1#qwen"`` -> ("http://h:8000/v1", "qwen"); ConfigError unless the URL is
    http(s) (the ``openai:URL[#MODEL]`` teacher and judge both come through here)."""
    from agentkit.rollout.openai_backend import check_http_url

    url, _, model = arg.partition("#")
    return check_http_url(url, "openai:URL[#MODEL]: the URL"), model or None


def openai_teacher(arg: str | None = None, *, tokenizer, bank: SkillBank | None = None,
                   privileged: Sequence[str] = (), **_: Any) -> PromptLogprobTeacher:
    """An OpenAI-compatible server with ``prompt_logprobs`` (vLLM): ``openai:URL[#MODEL]``.
    The key, if any, comes from $OPENAI_API_KEY."""
    from agentkit.rollout.openai_backend import OpenAIBackend

    if not arg:
        raise ConfigError("The `openai` teacher needs the server's URL: --teacher openai:http://HOST:PORT/v1[#MODEL].")
    url, model = split_url_model(arg)
    backend = OpenAIBackend(url, tokenizer, model=model)
    backend.check_tokenizer()  # token-level distillation: the server must share the student's ids
    return PromptLogprobTeacher(backend, tokenizer, name=f"openai:{url}#{backend.model}", privileged=privileged,
                                bank=bank)
