"""RLSD baseline (``docs/methods.md``, "RLSD").

GRPO whose per-token advantage is reweighted by the privileged teacher's opinion of the token, as
the SDAR paper's reference code computes it, once per step before the update:

    delta_t  = logT - logOld                         (the sampling-time logprobs)
    w_t      = clip(exp(sign(A) * delta_t), 1 - eps, 1 + eps)
    lambda_s = lambda * (1 - s / decay_steps) for s < decay_steps, else 0   (s = the 1-based step)
    A_t      = A * ((1 - lambda_s) + lambda_s * w_t)         lambda 0.5, eps 0.2, decay_steps 100

then GRPO's clipped policy gradient and KL with A_t. The weights depend only on the rollout (no
gradient, no dependence on the update's current logprobs), so ``prepare`` computes them; from
step ``decay_steps`` on RLSD is GRPO. ``decay_steps: 0`` keeps lambda constant. Teacher: the
policy itself with retrieved skills (``--teacher self``). Metrics: rlsd_lambda, weight_mean,
weight_clipped_share, gap stats (at sampling time).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import ClassVar

import torch
from agentkit.objectives.batch import TokenBatch
from agentkit.objectives.common import gap_metrics, masked_mean, with_teacher
from agentkit.objectives.grpo import GRPO, GRPOConfig
from agentkit.objectives.protocol import Capabilities
from agentkit.objectives.scores import StepScores
from pydantic import Field

from agentkit.core.trajectory import Trajectory


class RLSDConfig(GRPOConfig):
    lam: float = Field(0.5, ge=0, le=1, description="Mix of the teacher weight into the advantage at step 1.")
    weight_eps: float = Field(0.2, ge=0, description="Clip of the teacher weight: [1 - eps, 1 + eps].")
    decay_steps: int = Field(100, ge=0, description="lambda decays linearly to 0 at this step (0 = constant lambda).")


def rlsd_weights(advantages: torch.Tensor, gap: torch.Tensor, eps: float) -> torch.Tensor:
    """w = clip(exp(sign(A) * delta), 1 - eps, 1 + eps), [B, L]."""
    return torch.clamp(torch.exp(torch.sign(advantages) * gap), 1 - eps, 1 + eps)


def rlsd_lambda(lam: float, step: int, decay_steps: int) -> float:
    """lambda at the 1-based training ``step``: linear from ``lam`` (at step 0) to 0 at ``decay_steps``."""
    if decay_steps <= 0:
        return lam
    return 0.0 if step >= decay_steps else lam * (1 - step / decay_steps)


class RLSD(GRPO):
    Config = RLSDConfig
    capabilities: ClassVar[Capabilities] = replace(GRPO.capabilities, needs_teacher=True, default_teacher="self",
                                                   uses_skills=True)

    def prepare(self, trajectories: Sequence[Trajectory], scores: StepScores | None = None) -> TokenBatch:
        cfg = self.config
        batch = with_teacher(super().prepare(trajectories), scores, "rlsd")
        mask = batch.response_mask  # [B, L]
        gap = (batch.teacher_logprobs - batch.old_logprobs) * mask  # [B, L], at sampling time
        w = rlsd_weights(batch.advantages, gap, cfg.weight_eps)  # [B, L]
        lam = rlsd_lambda(cfg.lam, scores.step, cfg.decay_steps)
        raw = torch.exp(torch.sign(batch.advantages) * gap)
        metrics = {**gap_metrics(gap, mask), "rlsd_lambda": lam, "weight_mean": float(masked_mean(w, mask)),
                   "weight_clipped_share": float(masked_mean(((raw < 1 - cfg.weight_eps) | (raw > 1 + cfg.weight_eps)).float(), mask))}
        return replace(batch, advantages=batch.advantages * ((1 - lam) + lam * w) * mask,
                       metrics={**batch.metrics, **metrics})
