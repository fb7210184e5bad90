"""Tensor helpers every objective shares: masked means, group advantages, KL estimators, the
clipped policy-gradient term."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from agentkit.objectives.batch import TokenBatch
from agentkit.objectives.scores import StepScores


def group_advantages(returns: Sequence[float], groups: Sequence[str], *, normalize_std: bool = True,
                     unbiased_std: bool = True, eps: float = 1e-6) -> list[float]:
    """A_i = (R_i - mean of its group) / (std of its group + eps); without std if not normalize_std.

    The std is the unbiased (Bessel-corrected) group std by default, as verl and TRL compute it
    (``torch.std``); ``unbiased_std=False`` gives the population std (advantages sqrt(G / (G - 1))
    larger). A group of one, or of identical returns, gets zero advantages.
    """
    by_group: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        by_group.setdefault(g, []).append(i)
    out = [0.0] * len(returns)
    for members in by_group.values():
        values = torch.tensor([float(returns[i]) for i in members], dtype=torch.float64)
        centered = values - values.mean()
        if normalize_std and len(members) > 1:
            std = values.std(unbiased=unbiased_std)
            if std > 0:
                centered = centered / (std + eps)
        for i, a in zip(members, centered.tolist(), strict=True):
            out[i] = a
    return out


def aggregate(per_token: torch.Tensor, batch: TokenBatch, mode: str = "token-mean") -> torch.Tensor:
    """Reduce a [B, L] per-token loss over response tokens, with the whole minibatch's normalizers
    (``TokenBatch.with_normalizers``), so the sum over any split of a minibatch into micro-batches
    (or processes) equals the minibatch's value, whichever rows of an episode land where.

    token-mean: sum over all response tokens / the minibatch's response-token count.
    sequence-mean: each episode's token-mean, averaged over the minibatch's episodes: a row's
        tokens are divided by its episode's response tokens in the whole minibatch
        (``batch.episode_tokens``), never by the part of the episode a micro-batch holds.
    """
    mask = batch.response_mask  # [B, L]
    if mode == "token-mean":
        return (per_token * mask).sum() / batch.token_normalizer
    if mode == "sequence-mean":
        row_sums = (per_token * mask).sum(dim=1)  # [B]
        episode_tokens = batch.episode_tokens.to(row_sums.device, row_sums.dtype).clamp(min=1)  # [B]
        return (row_sums / episode_tokens).sum() / batch.sequence_normalizer
    raise ValueError(f"unknown aggregation {mode!r}; use 'token-mean' or 'sequence-mean'")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, clamp: float = 10.0) -> torch.Tensor:
    """Per-token "low_var_kl": exp(ref - logp) - (ref - logp) - 1 (>= 0), clamped at ``clamp``
    (verl's; 0 = no clamp). The log-ratio is clamped at +-20 before exp, as verl does."""
    delta = torch.clamp(ref_logprobs - logprobs, -20.0, 20.0)
    kl = torch.exp(delta) - delta - 1
    return torch.clamp(kl, -clamp, clamp) if clamp > 0 else kl


def clipped_pg(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
               clip_low: float, clip_high: float, dual_clip: float = 0.0,
               is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token -min(rho A, clip(rho, 1-clip_low, 1+clip_high) A) and whether it was clipped.

    With ``dual_clip`` = c > 1 (verl's ``clip_ratio_c``), a negative-advantage token's loss is
    also capped at -c A, so a ratio far above 1 cannot make its loss unbounded (dual-clip PPO).
    ``is_weights`` ([B, L], ``TokenBatch.is_weights``): each token's loss times its importance
    weight pi_old / pi_behaviour (decoupled PPO: the ratio is to the trainer's pi_old, the weight
    corrects for the sampler that drew the token); None = 1.
    """
    ratio = torch.exp(torch.clamp(logprobs - old_logprobs, -20.0, 20.0))  # [B, L]; verl's clamp before exp
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    was_clipped = clipped < unclipped
    if dual_clip > 0:
        capped = torch.minimum(loss, -dual_clip * advantages)
        was_clipped = was_clipped | ((advantages < 0) & (capped < loss))
        loss = torch.where(advantages < 0, capped, loss)
    if is_weights is not None:
        loss = loss * is_weights.detach()
    return loss, was_clipped


def with_teacher(batch: TokenBatch, scores: StepScores | None, objective: str) -> TokenBatch:
    """Attach the teacher's scores (computed by the loop, ``agentkit.train.scoring.score_step``) to ``batch``."""
    if scores is None or scores.teacher is None:
        raise ValueError(f"{objective} needs the teacher's scores: pass prepare(trajectories, scores) with "
                         "scores = agentkit.train.scoring.score_step(...) (the training loop does).")
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


def sampled_reverse_kl(logprobs: torch.Tensor, old_logprobs: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor,
                       clip_low: float, clip_high: float,
                       is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """OPD's sampled estimator per token [B, L]: -k_t = -(logS - logT), detached, as the token's
    advantage in the clipped policy gradient (no dual-clip, ``is_weights`` as there); and whether
    each token was clipped."""
    advantages = -(logprobs.detach() - teacher) * mask  # [B, L]
    return clipped_pg(logprobs, old_logprobs, advantages, clip_low, clip_high, is_weights=is_weights)


def gap_metrics(gap: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Teacher-student gap delta = logT - logS over response tokens."""
    return {"gap_mean": float(masked_mean(gap, mask)),
            "negative_gap_share": float(masked_mean((gap < 0).float(), mask))}


IS_CORRECTIONS = ("none", "truncate", "mask")


def off_policy_correction(batch: TokenBatch, old_logprobs: torch.Tensor, mode: str,
                          cap: float) -> TokenBatch:
    """``batch`` with the trainer's ``old_logprobs`` [B, L] as pi_old, the recorded (sampler's)
    logprobs kept as ``behaviour_logprobs``, and importance weights r = pi_old / pi_behaviour per
    response token as ``is_weights``:

        none:      w = 1 (the mismatch is measured, not corrected)
        truncate:  w = min(r, cap)                                  (truncated IS, TIS)
        mask:      w = r where 1/cap <= r <= cap; tokens outside are rejected: taken out of
                   ``response_mask``, so out of every loss term and its normalizer (masked IS)

    The log-ratio is clamped at +-20 before exp. Adds to ``batch.metrics`` the mismatch between
    sampler and trainer: ``mismatch_kl`` (the k3 estimate of KL(pi_behaviour || pi_old) on the
    sampled tokens), ``mismatch_logprob_abs`` (mean |log r|), the ratio's tails ``is_ratio_min``,
    ``is_ratio_p01``, ``is_ratio_p99``, ``is_ratio_max``, and ``is_corrected_share`` (tokens
    truncated or rejected).
    """
    if mode not in IS_CORRECTIONS:
        raise ValueError(f"unknown importance correction {mode!r}; use one of {', '.join(IS_CORRECTIONS)}")
    if cap <= 1:
        raise ValueError(f"the importance-ratio cap must be above 1, got {cap}")
    mask = batch.response_mask  # [B, L]
    behaviour = batch.old_logprobs  # [B, L], as sampled
    log_ratio = torch.clamp(old_logprobs - behaviour, -20.0, 20.0) * mask  # [B, L]
    ratio = torch.exp(log_ratio)  # [B, L]; 1 off the response
    kept = mask > 0
    values = ratio[kept]
    metrics = {"mismatch_kl": float(masked_mean(torch.exp(log_ratio) - 1 - log_ratio, mask)),
               "mismatch_logprob_abs": float(masked_mean(log_ratio.abs(), mask))}
    if values.numel():
        quantiles = torch.quantile(values.double(), torch.tensor([0.01, 0.99], dtype=torch.float64))
        metrics.update({"is_ratio_min": float(values.min()), "is_ratio_p01": float(quantiles[0]),
                        "is_ratio_p99": float(quantiles[1]), "is_ratio_max": float(values.max())})
    response = mask
    if mode == "none":
        weights, corrected = mask.clone(), torch.zeros_like(mask)
    elif mode == "truncate":
        weights, corrected = torch.clamp(ratio, max=cap) * mask, (ratio > cap).float() * mask
    else:
        inside = ((ratio >= 1 / cap) & (ratio <= cap)).float()
        corrected = (1 - inside) * mask
        response = mask * inside
        weights = ratio * response
    metrics["is_corrected_share"] = float(masked_mean(corrected, mask))
    return replace(batch, old_logprobs=old_logprobs * mask, behaviour_logprobs=behaviour, is_weights=weights,
                   response_mask=response, metrics={**batch.metrics, **metrics})
