"""SDAR: GRPO plus a gated self-distillation term (../shared/METHODS.md, "SDAR").

    L = L_GRPO + lambda * L_SDAR
    delta_t = logT(y_t | s_t+) - logS(y_t | s_t)        (logS detached for the gap)
    g_t     = sigmoid(beta * delta_t)                   (detached: a pure confidence weight)
    L_SDAR  = token-mean( g_t * (logT - logS) )          (logT detached: gradient -g_t d logS)

The teacher is the policy itself with retrieved skills as privileged context (``--teacher self
--skills BANK --retrieval S``). Defaults follow the paper's public code: lambda 0.01, beta 5,
kl_coef 0.01 (k3 to the initial policy); the paper's group size 8 is ``rollout.group_size``.
The GRPO term is ``grpo`` exactly (same settings). Metrics: gate_mean, gate_above_half,
gap_mean, negative_gap_share.
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


class SDARConfig(GRPOConfig):
    lam: float = Field(0.01, ge=0, description="Weight lambda of the SDAR term.")
    beta: float = Field(5.0, ge=0, description="Gate sharpness: g = sigmoid(beta * (logT - logS)).")
    kl_coef: float = Field(0.01, ge=0, description="Weight of the k3 KL to the frozen reference.")


def sdar_gate(logprobs: torch.Tensor, logT: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate g [B, L], gap delta [B, L]), both without gradient."""
    gap = (logT - logprobs).detach()
    return torch.sigmoid(beta * gap), gap


class SDAR(GRPO):
    Config = SDARConfig
    capabilities: ClassVar[Capabilities] = replace(GRPO.capabilities, needs_teacher=True, default_teacher="self",
                                                   uses_skills=True)

    def beta(self) -> float:
        return self.config.beta

    def prepare(self, trajectories: Sequence[Trajectory], scores: StepScores | None = None) -> TokenBatch:
        batch = with_teacher(super().prepare(trajectories), scores, type(self).__name__)
        gate, _ = sdar_gate(batch.old_logprobs, batch.teacher_logprobs, self.beta())  # [B, L], at sampling time
        return replace(batch, signals={**batch.signals, "gate": gate * batch.response_mask})

    def loss(self, batch: TokenBatch, logprobs: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        grpo_loss, metrics = super().loss(batch, logprobs)
        mask = batch.response_mask  # [B, L]
        logT = teacher_logprobs(batch, type(self).__name__)  # [B, L], no gradient
        gate, gap = sdar_gate(logprobs, logT, self.beta())  # [B, L]
        distill = aggregate(gate * (logT - logprobs), batch, "token-mean")
        metrics.update(gap_metrics(gap, mask))
        metrics.update({"gate_mean": float(masked_mean(gate, mask)),
                        "gate_above_half": float(masked_mean((gate > 0.5).float(), mask)),
                        "sdar_loss": float(distill.detach()), "grpo_loss": float(grpo_loss.detach())})
        return grpo_loss + self.config.lam * distill, metrics
