"""GRPO+OPSD, the naive hybrid baseline (../shared/METHODS.md, "SDAR": beta = 0).

SDAR with the gate fixed at sigmoid(0) = 0.5 on every token: GRPO plus an ungated
self-distillation pull toward the privileged teacher, whether the teacher agrees with the
student's token or not. The SDAR paper reports it collapsing on small models; that is the point
of having it.
"""

from __future__ import annotations

from agentkit.objectives.grpo import GRPOConfig
from agentkit.objectives.sdar import SDAR
from pydantic import Field


class GRPOOPSDConfig(GRPOConfig):
    lam: float = Field(0.01, ge=0, description="Weight of the self-distillation term.")
    kl_coef: float = Field(0.01, ge=0, description="Weight of the k3 KL to the frozen reference.")


class GRPOOPSD(SDAR):
    Config = GRPOOPSDConfig

    def beta(self) -> float:
        return 0.0
