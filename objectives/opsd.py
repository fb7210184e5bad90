"""OPSD, on-policy self-distillation, as the SDAR paper's baseline (``docs/methods.md``, "OPSD").

The paper's OPSD row is its reference code's ``pg_loss_coef=0`` run: SDAR without the GRPO
policy-gradient term, i.e. the gated self-distillation term plus the KL to the reference:

    L = kl_coef * KL + lambda * agg( g_t * (logT - logS) ),   g_t = sigmoid(beta * (logT - logS)) detached

with the reference values lambda 0.01, beta 5, kl_coef 0.01. The teacher is the policy itself
given privileged context (``--teacher self``: retrieved skills, and with
``teacher.privileged=[skills, env]`` the environment's privileged info for each turn's state), run
with the weights that sampled the rollout, without gradients. Episodes need no group (no advantage is used); setting
``pg_coef`` above 0 turns it back into ``sdar``.

The reverse-KL form (OPD whose teacher is the policy with privileged context, coefficient 1) is
``opsd_rkl``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from agentkit.objectives.opd import OPD, OPDConfig
from agentkit.objectives.protocol import Capabilities
from agentkit.objectives.sdar import SDAR, SDARConfig
from pydantic import Field


class OPSDConfig(SDARConfig):
    pg_coef: float = Field(0.0, ge=0, description="Weight of the GRPO policy-gradient term (0 in the paper's OPSD).")


class OPSD(SDAR):
    Config = OPSDConfig
    capabilities: ClassVar[Capabilities] = SDAR.capabilities  # needs_groups only with pg_coef > 0 (requirements())


class OPSDRKLConfig(OPDConfig):
    pass


class OPSDRKL(OPD):
    """OPD (``opd``'s estimators and settings) whose teacher is the policy itself with privileged
    context: the reverse KL to the self-teacher with coefficient 1, no GRPO term, no KL to a
    reference. Not the SDAR paper's OPSD row (that is ``opsd``)."""

    Config = OPSDRKLConfig
    capabilities: ClassVar[Capabilities] = replace(OPD.capabilities, default_teacher="self", uses_skills=True)
