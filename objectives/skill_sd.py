"""Skill-SD baseline (../shared/METHODS.md, "Baselines from the SDAR paper's table").

GRPO plus a small importance-weighted k3 distillation term toward the privileged teacher:

    l    = logS - logT
    k3   = exp(-l) - 1 + l                       (>= 0, zero when the two agree)
    rho  = exp(min(logS - logOld, 10))
    L    = L_GRPO + coef * token-mean(rho * k3)   coef 0.001

Departure: rho is detached (an importance weight for tokens sampled by the old policy); the
gradient flows through k3 only. METHODS.md does not say; detaching keeps the term a KL gradient.
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
    max_log_ratio: float = Field(10.0, gt=0, description="Clamp of logS - logOld before exp.")


class SkillSD(GRPO):
    Config = SkillSDConfig
    capabilities: ClassVar[Capabilities] = replace(GRPO.capabilities, needs_teacher=True, default_teacher="self",
                                                   uses_skills=True)

    def prepare(self, trajectories: Sequence[Trajectory], scores: StepScores | None = None) -> TokenBatch:
        return with_teacher(super().prepare(trajectories), scores, "skill_sd")

    def loss(self, batch: TokenBatch, logprobs: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        grpo_loss, metrics = super().loss(batch, logprobs)
        mask = batch.response_mask  # [B, L]
        logT = teacher_logprobs(batch, "skill_sd")  # [B, L]
        l = logprobs - logT  # noqa: E741  [B, L]
        k3 = torch.exp(-l) - 1 + l  # [B, L]
        rho = torch.exp(torch.clamp(logprobs - batch.old_logprobs, max=self.config.max_log_ratio)).detach()  # [B, L]
        distill = aggregate(rho * k3, batch, "token-mean")
        metrics.update(gap_metrics((logT - logprobs).detach(), mask))
        metrics["distill_k3"] = float(masked_mean(k3.detach(), mask))
        return grpo_loss + self.config.coef * distill, metrics
