"""GRPO for multi-turn episodes (../shared/METHODS.md, "GRPO").

A_i = (R_i - mean(R_group)) / (std(R_group) + eps), or without the std (Dr. GRPO); every response
token of every turn of episode i gets A_i. Per token: -min(rho A, clip(rho, 1-eps_low, 1+eps_high) A),
rho = exp(logS - logOld), plus kl_coef * k3(logRef, logS) when kl_coef > 0. Token-mean (default)
or sequence-mean. ``invalid_action_penalty`` is subtracted from the return once per invalid action
(verl-agent uses 0.1).

Departures: the std is the population std of the group (``unbiased=False``), as most GRPO code
computes it; a group whose returns are all equal gets zero advantages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import ClassVar, Literal

import torch
from agentkit.objectives.batch import TokenBatch, build_batch
from agentkit.objectives.common import aggregate, clipped_pg, group_advantages, k3_kl, masked_mean
from agentkit.objectives.protocol import Capabilities
from agentkit.objectives.scores import StepScores
from pydantic import BaseModel, ConfigDict, Field

from agentkit.core.trajectory import Trajectory


class GRPOConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    clip_low: float = Field(0.2, ge=0, description="PPO clip below: ratio >= 1 - clip_low.")
    clip_high: float = Field(0.28, ge=0, description="PPO clip above: ratio <= 1 + clip_high.")
    normalize_std: bool = Field(True, description="Divide advantages by the group's std (False: Dr. GRPO).")
    eps: float = Field(1e-6, gt=0, description="Added to the std.")
    kl_coef: float = Field(0.0, ge=0, description="Weight of the k3 KL to the frozen reference (0 = no reference).")
    aggregation: Literal["token-mean", "sequence-mean"] = Field("token-mean", description="How per-token losses are reduced.")
    invalid_action_penalty: float = Field(0.0, ge=0, description="Subtracted from the return per invalid action.")


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
                                      normalize_std=self.config.normalize_std, eps=self.config.eps)
        return build_batch(trajectories, advantages)

    def loss(self, batch: TokenBatch, logprobs: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.config
        mask = batch.response_mask  # [B, L]
        per_token, clipped = clipped_pg(logprobs, batch.old_logprobs, batch.advantages, cfg.clip_low, cfg.clip_high)  # [B, L]
        metrics = {"clip_fraction": float(masked_mean(clipped.float(), mask))}
        if cfg.kl_coef > 0:
            if batch.ref_logprobs is None:
                raise ValueError("GRPO with kl_coef > 0 needs batch.ref_logprobs (the loop fills them).")
            kl = k3_kl(logprobs, batch.ref_logprobs)  # [B, L]
            per_token = per_token + cfg.kl_coef * kl
            metrics["kl"] = float(masked_mean(kl.detach(), mask))
        loss = aggregate(per_token, batch, cfg.aggregation)
        metrics["pg_loss"] = float(loss.detach())
        metrics["ratio_mean"] = float(masked_mean(torch.exp(logprobs - batch.old_logprobs).detach(), mask))
        return loss, metrics
