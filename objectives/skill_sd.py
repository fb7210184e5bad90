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

import torch
from agentkit.objectives.batch import TokenBatch
from agentkit.objectives.common import masked_mean
from agentkit.objectives.grpo import GRPOConfig, GRPOWithTeacherTerm
from pydantic import Field


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


class SkillSD(GRPOWithTeacherTerm):
    Config = SkillSDConfig

    def term_weight(self) -> float:
        return self.config.coef

    def teacher_term(self, batch: TokenBatch, logprobs: torch.Tensor,
                     logT: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.config
        rho, k3 = skill_sd_terms(logprobs, logT, batch.old_logprobs, cfg.max_log_ratio, cfg.max_exponent)
        weights = 1.0 if batch.is_weights is None else batch.is_weights.detach()  # [B, L] or 1
        return rho * k3 * weights, {"distill_k3": float(masked_mean(k3.detach(), batch.response_mask))}
