"""Tensor helpers every objective shares: masked means, group advantages, KL estimators, the
clipped policy-gradient term."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from agentkit.objectives.batch import TokenBatch
from agentkit.objectives.scores import StepScores


def group_advantages(returns: Sequence[float], groups: Sequence[str], *, normalize_std: bool = True,
                     eps: float = 1e-6) -> list[float]:
    """A_i = (R_i - mean of its group) / (std of its group + eps); without std if not normalize_std."""
    by_group: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        by_group.setdefault(g, []).append(i)
    out = [0.0] * len(returns)
    for members in by_group.values():
        values = torch.tensor([float(returns[i]) for i in members], dtype=torch.float64)
        centered = values - values.mean()
        if normalize_std:
            # population std, as in GRPO implementations; a group of identical returns gets 0
            std = values.std(unbiased=False)
            if std > 0:
                centered = centered / (std + eps)
        for i, a in zip(members, centered.tolist(), strict=True):
            out[i] = a
    return out


def aggregate(per_token: torch.Tensor, batch: TokenBatch, mode: str = "token-mean") -> torch.Tensor:
    """Reduce a [B, L] per-token loss over response tokens.

    token-mean: sum over all response tokens / the minibatch's response-token count.
    sequence-mean: each episode's token-mean, averaged over the minibatch's episodes.
    """
    mask = batch.response_mask  # [B, L]
    if mode == "token-mean":
        return (per_token * mask).sum() / batch.token_normalizer
    if mode == "sequence-mean":
        episodes = batch.episode_index  # [B]
        unique, inverse = torch.unique(episodes, return_inverse=True)
        zeros = torch.zeros(len(unique), dtype=per_token.dtype, device=per_token.device)  # [E]
        sums = zeros.index_add(0, inverse, (per_token * mask).sum(dim=1))
        counts = zeros.index_add(0, inverse, mask.sum(dim=1))
        return (sums / counts.clamp(min=1)).sum() / batch.sequence_normalizer
    raise ValueError(f"unknown aggregation {mode!r}; use 'token-mean' or 'sequence-mean'")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token "low_var_kl": exp(ref - logp) - (ref - logp) - 1 (>= 0)."""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1


def clipped_pg(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
               clip_low: float, clip_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token -min(rho A, clip(rho, 1-clip_low, 1+clip_high) A) and whether it was clipped."""
    ratio = torch.exp(logprobs - old_logprobs)  # [B, L]
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * advantages
    return -torch.minimum(unclipped, clipped), (clipped < unclipped)


def with_teacher(batch: TokenBatch, scores: StepScores | None, objective: str) -> TokenBatch:
    """Attach the teacher's scores (computed by the loop, ``agentkit.scoring.score_step``) to ``batch``."""
    if scores is None or scores.teacher is None:
        raise ValueError(f"{objective} needs the teacher's scores: pass prepare(trajectories, scores) with "
                         "scores = agentkit.scoring.score_step(...) (the training loop does).")
    teacher = scores.teacher
    if tuple(teacher.logprobs.shape) != tuple(batch.response_mask.shape):
        raise ValueError(f"{objective}: the teacher's scores are {tuple(teacher.logprobs.shape)}, the batch "
                         f"{tuple(batch.response_mask.shape)}; score the same trajectories, in the same order.")
    return replace(batch, teacher_logprobs=teacher.logprobs, teacher_top1=teacher.top1,
                   teacher_support_ids=teacher.support_ids, teacher_support_logprobs=teacher.support_logprobs)


def teacher_logprobs(batch: TokenBatch, objective: str) -> torch.Tensor:
    if batch.teacher_logprobs is None:
        raise ValueError(f"{objective}: batch.teacher_logprobs is missing; build the batch with the objective's "
                         "prepare(trajectories, scores) with the teacher's scores.")
    return batch.teacher_logprobs.detach()  # a teacher quantity never carries gradient


def opd_advantages(logprobs: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token advantage -k_t = -(logS - logT), detached (the sampled reverse-KL estimate)."""
    return -(logprobs.detach() - teacher) * mask


def gap_metrics(gap: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Teacher-student gap delta = logT - logS over response tokens."""
    return {"gap_mean": float(masked_mean(gap, mask)),
            "negative_gap_share": float(masked_mean((gap < 0).float(), mask))}
