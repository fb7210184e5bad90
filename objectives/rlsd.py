"""RLSD baseline (../shared/METHODS.md, "Baselines from the SDAR paper's table").

GRPO whose per-token advantage is reweighted by the privileged teacher's opinion of the token:

    delta_t = logT - logS (detached)
    w_t     = clip(exp(sign(A) * delta_t), 1 - eps, 1 + eps)
    A_t     = A * ((1 - lambda) + lambda * w_t)              lambda 0.5, eps 0.2

then GRPO's clipped policy gradient (and optional k3 KL) with A_t. Teacher: the policy itself
with retrieved skills (``--teacher self``). Metrics: weight_mean, weight_clipped_share, gap stats.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import ClassVar

import torch
from agentkit.objectives.batch import TokenBatch
from agentkit.objectives.common import gap_metrics, masked_mean, teacher_logprobs, with_teacher
from agentkit.objectives.grpo import GRPO, GRPOConfig
from agentkit.objectives.protocol import Capabilities
from agentkit.objectives.scores import StepScores
from pydantic import Field

from agentkit.core.trajectory import Trajectory


class RLSDConfig(GRPOConfig):
    lam: float = Field(0.5, ge=0, le=1, description="Mix of the teacher weight into the advantage.")
    weight_eps: float = Field(0.2, ge=0, description="Clip of the teacher weight: [1 - eps, 1 + eps].")


def rlsd_weights(advantages: torch.Tensor, gap: torch.Tensor, eps: float) -> torch.Tensor:
    """w = clip(exp(sign(A) * delta), 1 - eps, 1 + eps), [B, L]."""
    return torch.clamp(torch.exp(torch.sign(advantages) * gap), 1 - eps, 1 + eps)


class RLSD(GRPO):
    Config = RLSDConfig
    capabilities: ClassVar[Capabilities] = replace(GRPO.capabilities, needs_teacher=True, default_teacher="self",
                                                   uses_skills=True)

    def prepare(self, trajectories: Sequence[Trajectory], scores: StepScores | None = None) -> TokenBatch:
        return with_teacher(super().prepare(trajectories), scores, "rlsd")

    def loss(self, batch: TokenBatch, logprobs: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        cfg, mask = self.config, batch.response_mask  # [B, L]
        gap = (teacher_logprobs(batch, "rlsd") - logprobs).detach()  # [B, L]
        w = rlsd_weights(batch.advantages, gap, cfg.weight_eps)  # [B, L]
        reweighted = batch.advantages * ((1 - cfg.lam) + cfg.lam * w)
        loss, metrics = super().loss(replace(batch, advantages=reweighted), logprobs)
        metrics.update(gap_metrics(gap, mask))
        raw = torch.exp(torch.sign(batch.advantages) * gap)
        metrics["weight_mean"] = float(masked_mean(w, mask))
        metrics["weight_clipped_share"] = float(masked_mean(((raw < 1 - cfg.weight_eps) | (raw > 1 + cfg.weight_eps)).float(), mask))
        return loss, metrics
