"""OPSD: on-policy self-distillation (../shared/METHODS.md, "OPSD").

OPD whose teacher is the policy itself, given privileged context: logT = log pi(y | s_t+), with
s_t+ = the student's context plus a labelled block of retrieved skills (and, with
``teacher.privileged=[skills, env]``, the environment's privileged info for the turn's state). The
teacher runs with the weights that sampled the rollout, before the step's update, without
gradients. Same estimators and settings as ``opd``.
"""

from __future__ import annotations

from typing import ClassVar

from agentkit.objectives.opd import OPD, OPDConfig
from agentkit.objectives.protocol import Capabilities


class OPSDConfig(OPDConfig):
    pass


class OPSD(OPD):
    Config = OPSDConfig
    capabilities: ClassVar[Capabilities] = Capabilities(needs_teacher=True, default_teacher="self", uses_skills=True,
                                                        needs_support=True)
