"""Teachers backed by a transformers model: ``self`` (the policy that sampled the rollout) and
``model`` (a separate, usually larger, local Hugging Face folder).

Both score the student's own tokens: for each response token, the teacher's log-prob of it, the
teacher's top-1 log-prob at that position, and optionally the top-k (or full-vocabulary)
distribution, with the privileged block of the token's turn (``teachers.context``) in front of the
student's ids.
Scoring runs without gradients. Other backends (vLLM ``prompt_logprobs``, OpenAI-compatible
servers) implement the same ``score`` method and plug in through ``agentkit.teachers``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from agentkit.objectives import position_logits, sampled_distribution
from agentkit.skillbank.bank import SkillBank
from agentkit.teachers.context import SOURCES, TeacherSequence, prefix_ids, privileged_text, teacher_sequences
from agentkit.teachers.scores import TeacherScores

from agentkit.core.errors import ConfigError, ModelError
from agentkit.core.trajectory import Trajectory


def check_same_tokenizer(student: Any, teacher: Any, teacher_name: str) -> None:
    """Refuse a teacher whose token ids mean something else than the student's."""
    if student is teacher:
        return
    s_vocab, t_vocab = student.get_vocab(), teacher.get_vocab()
    if s_vocab != t_vocab:
        only_s = sorted(set(s_vocab) - set(t_vocab))[:5]
        only_t = sorted(set(t_vocab) - set(s_vocab))[:5]
        moved = [tok for tok in set(s_vocab) & set(t_vocab) if s_vocab[tok] != t_vocab[tok]][:5]
        raise ModelError(
            f"Teacher {teacher_name} has a different tokenizer from the student (vocabulary {len(t_vocab)} vs "
            f"{len(s_vocab)} tokens; only in the student: {only_s}, only in the teacher: {only_t}, different ids: "
            f"{moved}). Token-level distillation compares the two models' log-probs of the same token ids, so they "
            "must share one tokenizer: build both with `agentkit model init` (any --size), or pick a teacher of the "
            "student's family."
        )


class ModelTeacher:
    """Scores student tokens with a causal LM.

    Args:
        model: the teacher module (for ``self``, the policy module itself).
        tokenizer: the teacher's tokenizer (checked against the student's by ``make_teacher``).
        name: for messages and metrics.
        privileged: which privileged sources to show it: "skills" (retrieved skills), "env" (the
            environment's privileged info).
        bank: where retrieved skill ids are looked up.
        micro_batch_tokens: padded tokens per scoring forward pass.
    """

    def __init__(self, model, tokenizer, *, name: str, privileged: Sequence[str] = (), bank: SkillBank | None = None,
                 micro_batch_tokens: int = 16384) -> None:
        unknown = [p for p in privileged if p not in SOURCES]
        if unknown:
            raise ConfigError(f"Unknown privileged source(s) {unknown}; choose from {list(SOURCES)}.")
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.privileged, self.bank = tuple(privileged), bank
        self.micro_batch_tokens = micro_batch_tokens

    full_vocabulary = True  # a local model: every logit is ours

    def prefixes(self, trajectories: Sequence[Trajectory]) -> list[list[int]]:
        """Each episode's privileged block at reset, as token ids (a later turn's may differ:
        ``teacher_sequences``)."""
        return [prefix_ids(self.tokenizer, privileged_text(t, self.privileged, self.bank)) for t in trajectories]

    @torch.no_grad()
    def score(self, batch, trajectories: Sequence[Trajectory], *, topk: int | None = None) -> TeacherScores:
        """Teacher log-probs at ``batch``'s response positions, at each row's sampling temperature
        (log softmax(logits / T), as the trainer computes the student's; verl does the same).

        ``topk``: None = no distribution; 0 = the full vocabulary; k > 0 = the teacher's top k.
        """
        was_training = self.model.training
        self.model.eval()
        try:
            sequences = teacher_sequences(batch, trajectories, self.privileged, self.bank, self.tokenizer)
            return self._score(batch, sequences, topk)
        finally:
            self.model.train(was_training)

    def _score(self, batch, sequences: list[TeacherSequence], topk: int | None) -> TeacherScores:
        rows, length = batch.num_rows, batch.response_mask.shape[1]
        out_lp = torch.zeros((rows, length))
        out_top1 = torch.zeros((rows, length))
        vocab = None
        support_ids = support_lp = None
        order = sorted(sequences, key=lambda s: len(s.prefix) + s.length)
        chunk: list[TeacherSequence] = []
        chunks = []
        for seq in order:
            width = max([len(s.prefix) + s.length for s in chunk + [seq]])
            if chunk and width * (len(chunk) + 1) > self.micro_batch_tokens:
                chunks.append(chunk)
                chunk = []
            chunk.append(seq)
        if chunk:
            chunks.append(chunk)
        for chunk in chunks:
            seqs = [s.prefix + batch.input_ids[s.row, : s.length].tolist() for s in chunk]
            width = max(len(s) for s in seqs)
            ids = torch.zeros((len(seqs), width), dtype=torch.long)
            mask = torch.zeros((len(seqs), width), dtype=torch.long)
            for i, s in enumerate(seqs):
                ids[i, : len(s)] = torch.tensor(s)
                mask[i, : len(s)] = 1
            device = next(self.model.parameters()).device
            # only the positions that predict a response token go through the output layer, the
            # softmax and back to the CPU: batch column t predicts input_ids[r, t+1]; in the teacher
            # row that is position p+t
            wanted = [(i, s.row, len(s.prefix) + t, t) for i, s in enumerate(chunk) for t in s.columns]
            if not wanted:
                continue
            chunk_rows = torch.tensor([i for i, _, _, _ in wanted])
            positions = torch.tensor([pos for _, _, pos, _ in wanted])
            rows_out = torch.tensor([r for _, r, _, _ in wanted])
            cols_out = torch.tensor([t for _, _, _, t in wanted])
            temperature = None if batch.temperature is None else batch.temperature[rows_out]  # as the student's
            logits = position_logits(self.model, ids.to(device), mask.to(device), chunk_rows, positions)  # [N, V]
            picked = sampled_distribution(logits, temperature).cpu()  # [N, V]
            vocab = picked.shape[-1]
            if topk is not None and support_lp is None:
                k = vocab if topk == 0 else min(topk, vocab)
                support_lp = torch.zeros((rows, length, k))
                support_ids = None if topk == 0 else torch.zeros((rows, length, k), dtype=torch.long)
            targets = batch.input_ids[rows_out, cols_out + 1]  # [N]
            out_lp[rows_out, cols_out] = picked.gather(1, targets[:, None]).squeeze(1)
            out_top1[rows_out, cols_out] = picked.max(dim=1).values
            if support_lp is not None:
                if support_ids is None:
                    support_lp[rows_out, cols_out] = picked
                else:
                    values, indices = picked.topk(support_lp.shape[-1], dim=1)
                    support_lp[rows_out, cols_out], support_ids[rows_out, cols_out] = values, indices
        mask = batch.response_mask
        if support_lp is not None:
            support_lp = support_lp * mask[..., None]
        return TeacherScores(logprobs=out_lp * mask, top1=out_top1 * mask, support_ids=support_ids,
                             support_logprobs=support_lp)

    def generation_backend(self, seed: int = 0):
        """A greedy generation backend over the same weights (for the turn judge)."""
        from agentkit.rollout.hf_backend import HFBackend

        return HFBackend(self.model, self.tokenizer, seed=seed, name=self.name,
                         device=str(next(self.model.parameters()).device))


def self_teacher(*, policy, tokenizer, bank: SkillBank | None = None, privileged: Sequence[str] = ("skills",),
                 **_: Any) -> ModelTeacher:
    """The policy itself, with privileged context (OPSD, SDAR, RLSD, Skill-SD)."""
    return ModelTeacher(policy, tokenizer, name="self", privileged=privileged, bank=bank)


def model_teacher(arg: str | None = None, *, tokenizer, bank: SkillBank | None = None,
                  privileged: Sequence[str] = (), dtype: torch.dtype = torch.float32, device: str = "cpu",
                  **_: Any) -> ModelTeacher:
    """A separate local Hugging Face model folder: ``model:DIR``, frozen, in ``dtype`` on ``device``."""
    from agentkit.rollout.hf_backend import load_causal_lm, load_tokenizer

    if not arg:
        raise ConfigError("The `model` teacher needs a folder: --teacher model:DIR (a Hugging Face model folder).")
    path = Path(arg)
    teacher_tokenizer = load_tokenizer(path)
    check_same_tokenizer(tokenizer, teacher_tokenizer, str(path))
    model = load_causal_lm(path, dtype=dtype, device=device)
    model.requires_grad_(False)
    return ModelTeacher(model, teacher_tokenizer, name=f"model:{path}", privileged=privileged, bank=bank)
