"""SDAR: GRPO plus a gated self-distillation term (``docs/methods.md``, "SDAR").

    L = pg_coef * L_PG + kl_coef * KL + lambda * L_SDAR          (one aggregation, ``aggregation``)
    delta_t = logT(y_t | s_t+) - logS(y_t | s_t)        (logS detached for the gap)
    g_t     = sigmoid(beta * delta_t)                   (detached: a pure confidence weight)
    L_SDAR  = agg( g_t * (logT - logS) )                 (logT detached: gradient -g_t d logS)

L_PG and KL are ``grpo``'s exactly (same settings and defaults). The teacher is the policy itself
with retrieved skills as privileged context (``--teacher self``). Defaults are the paper's public
code's: lambda 0.01, beta 5, kl_coef 0.01 (k3 to the initial policy), pg_coef 1; the paper's
group size 8 is ``rollout.group_size``. The distillation term is reduced with the policy loss's
aggregation mode, as in the reference. Metrics: gate_mean, gate_above_half, gap_mean,
negative_gap_share, sdar_loss, grpo_loss.

The SDAR paper's OPSD and GRPO+OPSD baselines are this code with pg_coef = 0 (``opsd``) and with
beta = 0 (``grpo_opsd``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from agentkit.objectives.batch import TokenBatch
from agentkit.objectives.common import masked_mean
from agentkit.objectives.grpo import GRPOConfig, GRPOWithTeacherTerm
from agentkit.objectives.protocol import Capabilities
from agentkit.objectives.scores import StepScores
from pydantic import Field

from agentkit.core.trajectory import Trajectory


class SDARConfig(GRPOConfig):
    lam: float = Field(0.01, ge=0, description="Weight lambda of the SDAR term.")
    beta: float = Field(5.0, ge=0, description="Gate sharpness: g = sigmoid(beta * (logT - logS)).")
    pg_coef: float = Field(1.0, ge=0, description="Weight of the GRPO policy-gradient term (0: the paper's OPSD).")


def sdar_gate(logprobs: torch.Tensor, logT: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate g [B, L], gap delta [B, L]), both without gradient."""
    gap = (logT - logprobs).detach()
    return torch.sigmoid(beta * gap), gap


class SDAR(GRPOWithTeacherTerm):
    Config = SDARConfig
    term_metric = "sdar_loss"

    def beta(self) -> float:
        return self.config.beta

    def pg_coef(self) -> float:
        return self.config.pg_coef

    def term_weight(self) -> float:
        return self.config.lam

    def requirements(self) -> Capabilities:
        return replace(super().requirements(), needs_groups=self.pg_coef() > 0)

    def prepare(self, trajectories: Sequence[Trajectory], scores: StepScores | None = None) -> TokenBatch:
        batch = super().prepare(trajectories, scores)
        gate, _ = sdar_gate(batch.old_logprobs, batch.teacher_logprobs, self.beta())  # [B, L], at sampling time
        return replace(batch, signals={**batch.signals, "gate": gate * batch.response_mask})

    def teacher_term(self, batch: TokenBatch, logprobs: torch.Tensor,
                     logT: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        mask = batch.response_mask  # [B, L]
        gate, _ = sdar_gate(logprobs, logT, self.beta())  # [B, L]
        return gate * (logT - logprobs), {"gate_mean": float(masked_mean(gate, mask)),
                                          "gate_above_half": float(masked_mean((gate > 0.5).float(), mask))}
