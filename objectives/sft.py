"""SFT: negative log-likelihood of response tokens (environment and prompt tokens masked).

Used to warm-start tiny policies from expert demonstrations (``agentkit demos``). Token-mean over
the minibatch's response tokens, each weighted by ``batch.weights``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from agentkit.objectives.batch import TokenBatch, build_batch
from agentkit.objectives.common import aggregate
from agentkit.objectives.protocol import Capabilities
from agentkit.objectives.scores import StepScores
from pydantic import BaseModel, ConfigDict

from agentkit.core.trajectory import Trajectory


class SFTConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SFT:
    Config = SFTConfig
    capabilities: ClassVar[Capabilities] = Capabilities(uses_demonstrations=True)

    def __init__(self, config: SFTConfig | None = None) -> None:
        self.config = config or SFTConfig()

    def requirements(self) -> Capabilities:
        return self.capabilities

    def prepare(self, trajectories: Sequence[Trajectory], scores: StepScores | None = None) -> TokenBatch:
        return build_batch(trajectories)

    def loss(self, batch: TokenBatch, logprobs: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        nll = -logprobs * batch.weights  # [B, L]
        loss = aggregate(nll, batch, "token-mean")
        return loss, {"nll": float(loss.detach())}
