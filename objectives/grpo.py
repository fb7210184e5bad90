"""GRPO for multi-turn episodes (``docs/methods.md``, "GRPO").

A_i = (R_i - mean(R_group)) / (std(R_group) + eps), or without the std (Dr. GRPO); every response
token of every turn of episode i gets A_i. Per token: -min(rho A, clip(rho, 1-eps_low, 1+eps_high) A),
rho = exp(logS - logOld), plus kl_coef * k3(logRef, logS) when kl_coef > 0. Token-mean (default)
or sequence-mean. ``invalid_action_penalty`` is subtracted from the return once per invalid action
(verl-agent uses 0.1).

Defaults are the reference code's (verl, and the SDAR paper's scripts): the unbiased group std
(``unbiased_std``), dual-clip c = 3 for negative advantages, kl_coef 0.01 with the k3 estimate
clamped at +-10; ``docs/methods.md`` lists each setting with its reference value and every
departure. A group whose returns are all equal (or a group of one) gets zero advantages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import ClassVar, Literal

import torch
from agentkit.objectives.batch import TokenBatch, build_batch
from agentkit.objectives.common import (
    aggregate,
    clipped_pg,
    gap_metrics,
    group_advantages,
    k3_kl,
    masked_mean,
    teacher_logprobs,
    with_teacher,
)
from agentkit.objectives.protocol import Capabilities
from agentkit.objectives.scores import StepScores
from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentkit.core.trajectory import Trajectory


class GRPOConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    clip_low: float = Field(0.2, ge=0, description="PPO clip below: ratio >= 1 - clip_low.")
    clip_high: float = Field(0.2, ge=0, description="PPO clip above: ratio <= 1 + clip_high.")
    dual_clip: float = Field(3.0, description="Dual-clip c (> 1) caps a negative-advantage token's loss at -c A "
                                              "(verl's clip_ratio_c); 0 = off.")
    normalize_std: bool = Field(True, description="Divide advantages by the group's std (False: Dr. GRPO).")
    unbiased_std: bool = Field(True, description="The group std is Bessel-corrected, as in verl and TRL (False: the "
                                                 "population std).")
    eps: float = Field(1e-6, gt=0, description="Added to the std.")
    kl_coef: float = Field(0.01, ge=0, description="Weight of the k3 KL to the frozen reference (0 = no reference).")
    kl_clamp: float = Field(10.0, ge=0, description="Clamp of the per-token k3 KL at +-kl_clamp (verl's; 0 = off).")
    aggregation: Literal["token-mean", "sequence-mean"] = Field("token-mean", description="How per-token losses are reduced.")
    invalid_action_penalty: float = Field(0.0, ge=0, description="Subtracted from the return per invalid action.")

    @field_validator("dual_clip")
    @classmethod
    def _dual_clip_above_one(cls, value: float) -> float:
        if value != 0 and value <= 1:
            raise ValueError("dual_clip must be above 1 (the reference uses 3), or 0 to turn it off")
        return value


def shaped_returns(trajectories: Sequence[Trajectory], invalid_action_penalty: float) -> list[float]:
    return [t.episode_return - invalid_action_penalty * sum(not turn.action_valid for turn in t.turns)
            for t in trajectories]


class GRPO:
    Config = GRPOConfig
    # needs_reference: some settings (kl_coef > 0) do; requirements() says whether these do
    capabilities: ClassVar[Capabilities] = Capabilities(needs_groups=True, needs_reference=True)

    def __init__(self, config: GRPOConfig | None = None) -> None:
        self.config = config or self.Config()

    def requirements(self) -> Capabilities:
        return replace(self.capabilities, needs_reference=self.config.kl_coef > 0)

    def prepare(self, trajectories: Sequence[Trajectory], scores: StepScores | None = None) -> TokenBatch:
        returns = shaped_returns(trajectories, self.config.invalid_action_penalty)
        advantages = group_advantages(returns, [t.group for t in trajectories],
                                      normalize_std=self.config.normalize_std,
                                      unbiased_std=self.config.unbiased_std, eps=self.config.eps)
        return build_batch(trajectories, advantages)

    def policy_terms(self, batch: TokenBatch, logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """Per-token clipped policy gradient [B, L], kl_coef * k3 KL [B, L] (zeros without a KL),
        and their metrics; objectives built on GRPO combine them with their own per-token terms
        before one aggregation."""
        cfg = self.config
        mask = batch.response_mask  # [B, L]
        pg, clipped = clipped_pg(logprobs, batch.old_logprobs, batch.advantages, cfg.clip_low, cfg.clip_high,
                                 cfg.dual_clip, batch.is_weights)  # [B, L]
        metrics = {"clip_fraction": float(masked_mean(clipped.float(), mask)),
                   "ratio_mean": float(masked_mean(torch.exp(logprobs - batch.old_logprobs).detach(), mask))}
        kl_term = torch.zeros_like(pg)
        if cfg.kl_coef > 0:
            if batch.ref_logprobs is None:
                raise ValueError(f"{type(self).__name__} with kl_coef > 0 needs batch.ref_logprobs (the loop fills them; "
                                 "set objective.args.kl_coef=0 to train without a reference).")
            kl = k3_kl(logprobs, batch.ref_logprobs, cfg.kl_clamp)  # [B, L]
            kl_term = cfg.kl_coef * kl
            metrics["kl"] = float(masked_mean(kl.detach(), mask))
        return pg, kl_term, metrics

    def loss(self, batch: TokenBatch, logprobs: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        pg, kl_term, metrics = self.policy_terms(batch, logprobs)
        loss = aggregate(pg + kl_term, batch, self.config.aggregation)
        metrics["pg_loss"] = float(loss.detach())
        return loss, metrics


class GRPOWithTeacherTerm(GRPO):
    """GRPO plus a per-token term toward the privileged teacher, both in one aggregation:

        L = pg_coef * agg(PG) + kl_coef * agg(k3) + weight * agg(term)

    (``sdar``, ``skill_sd``, ``grpo_opsd_rkl``). A subclass gives ``teacher_term`` (the per-token
    term [B, L] and its own metrics) and ``term_weight``; every one logs the gap metrics, the
    term's aggregate as ``term_metric`` and the unweighted policy-gradient term as ``grpo_loss``.
    """

    capabilities: ClassVar[Capabilities] = replace(GRPO.capabilities, needs_teacher=True, default_teacher="self",
                                                   uses_skills=True)
    term_metric: ClassVar[str] = "distill_loss"

    def pg_coef(self) -> float:
        return 1.0

    def term_weight(self) -> float:
        raise NotImplementedError(f"{type(self).__name__} must define term_weight()")

    def teacher_term(self, batch: TokenBatch, logprobs: torch.Tensor,
                     logT: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError(f"{type(self).__name__} must define teacher_term()")

    def prepare(self, trajectories: Sequence[Trajectory], scores: StepScores | None = None) -> TokenBatch:
        return with_teacher(super().prepare(trajectories), scores, type(self).__name__)

    def loss(self, batch: TokenBatch, logprobs: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        cfg, mask = self.config, batch.response_mask  # [B, L]
        pg, kl_term, metrics = self.policy_terms(batch, logprobs)  # [B, L] each
        logT = teacher_logprobs(batch, type(self).__name__)  # [B, L], no gradient
        term, term_metrics = self.teacher_term(batch, logprobs, logT)  # [B, L]
        loss = aggregate(self.pg_coef() * pg + kl_term + self.term_weight() * term, batch, cfg.aggregation)
        metrics.update(gap_metrics((logT - logprobs).detach(), mask))
        metrics.update(term_metrics)
        metrics.update({self.term_metric: float(aggregate(term.detach(), batch, cfg.aggregation)),
                        "grpo_loss": float(aggregate(pg.detach(), batch, cfg.aggregation))})  # unweighted by pg_coef
        return loss, metrics

