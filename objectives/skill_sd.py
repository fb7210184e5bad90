"""Skill-SD baseline (``docs/methods.md``, "Skill-SD").

GRPO plus a small importance-weighted k3 distillation term toward the privileged teacher, as the
SDAR paper's reference code computes it:

    l    = logS - logT
    k3   = exp(min(-l, 20)) - 1 + l              (>= 0, zero when the two agree; exponent clamped at 20)
    rho  = exp(min(logS - logOld, 10))            (differentiable: NOT detached)
    L    = L_GRPO + coef * agg(rho * k3)           coef 0.001, agg = the policy loss's aggregation

Keeping rho differentiable is what makes the term's gradient the unbiased reverse-KL gradient on
the old policy's samples: d(rho k3) = (rho k3 + rho (1 - e^-l)) d logS = rho (logS - logT) d logS
(below the clamps). Detaching rho would leave rho (1 - pT/pS) d logS: the same loss
value, a different direction with an unbounded weight where the teacher likes a token far more
than the student. The KL to the reference is GRPO's (kl_coef 0.01 by default).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import ClassVar

import torch
from agentkit.objectives.batch import TokenBatch
from agentkit.objectives.common import aggregate, gap_metrics, masked_mean, teacher_logprobs, with_teacher
from agentkit.objectives.grpo import GRPO, GRPOConfig
from agentkit.objectives.protocol import Capabilities
from agentkit.objectives.scores import StepScores
from pydantic import Field

from agentkit.core.trajectory import Trajectory


class SkillSDConfig(GRPOConfig):
    coef: float = Field(0.001, ge=0, description="Weight of the distillation term.")
    max_log_ratio: float = Field(10.0, gt=0, description="Clamp (above) of logS - logOld before exp.")
    max_exponent: float = Field(20.0, gt=0, description="Clamp (above) of k3's exponent logT - logS.")


def skill_sd_terms(logprobs: torch.Tensor, logT: torch.Tensor, old_logprobs: torch.Tensor, max_log_ratio: float,
                   max_exponent: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rho [B, L], k3 [B, L]), both differentiable in ``logprobs``."""
    ell = logprobs - logT
    k3 = torch.exp(torch.clamp(-ell, max=max_exponent)) - 1 + ell
    rho = torch.exp(torch.clamp(logprobs - old_logprobs, max=max_log_ratio))
    return rho, k3


class SkillSD(GRPO):
    Config = SkillSDConfig
    capabilities: ClassVar[Capabilities] = replace(GRPO.capabilities, needs_teacher=True, default_teacher="self",
                                                   uses_skills=True)

    def prepare(self, trajectories: Sequence[Trajectory], scores: StepScores | None = None) -> TokenBatch:
        return with_teacher(super().prepare(trajectories), scores, "skill_sd")

    def loss(self, batch: TokenBatch, logprobs: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        cfg, mask = self.config, batch.response_mask  # [B, L]
        pg, kl_term, metrics = self.policy_terms(batch, logprobs)  # [B, L] each
        logT = teacher_logprobs(batch, "skill_sd")  # [B, L]
        rho, k3 = skill_sd_terms(logprobs, logT, batch.old_logprobs, cfg.max_log_ratio, cfg.max_exponent)
        distill = rho * k3  # [B, L]
        loss = aggregate(pg + kl_term + cfg.coef * distill, batch, cfg.aggregation)
        metrics.update(gap_metrics((logT - logprobs).detach(), mask))
        metrics.update({"distill_k3": float(masked_mean(k3.detach(), mask)),
                        "distill_loss": float(aggregate(distill.detach(), batch, cfg.aggregation)),
                        "grpo_loss": float(aggregate(pg.detach(), batch, cfg.aggregation))})
        return loss, metrics
