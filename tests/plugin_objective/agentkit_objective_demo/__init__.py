"""An external objective: SFT that weights the tokens of later turns more (a toy, for the plugin test)."""

from __future__ import annotations

from typing import ClassVar

from agentkit.objectives import Capabilities, build_batch
from pydantic import BaseModel, ConfigDict, Field


class WeightedSFTConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    turn_bonus: float = Field(0.5, ge=0, description="Extra weight per turn index.")


class WeightedSFT:
    Config = WeightedSFTConfig
    capabilities: ClassVar[Capabilities] = Capabilities(uses_demonstrations=True)

    def __init__(self, config: WeightedSFTConfig) -> None:
        self.config = config

    def requirements(self) -> Capabilities:
        return self.capabilities

    def prepare(self, trajectories, scores=None):
        return build_batch(trajectories)

    def loss(self, batch, logprobs):
        weights = batch.response_mask * (1 + self.config.turn_bonus * batch.turn_index.clamp(min=0))  # [B, L]
        loss = (-logprobs * weights).sum() / batch.token_normalizer
        return loss, {"weighted_nll": float(loss.detach()), "mean_weight": float(weights.sum() / batch.response_mask.sum())}
