"""Skill-GRPO baseline: GRPO where the policy itself sees the retrieved skills, at train and at
test time (``docs/methods.md``, "Skill-GRPO").

The maths is ``grpo`` exactly; what differs is the rollout: the collector puts the retrieved
skills ("[Skills]" block) before the first observation of every episode, training and evaluation
alike, and records their ids in the trajectory (``skills_in_prompt: true``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from agentkit.objectives.grpo import GRPO, GRPOConfig
from agentkit.objectives.protocol import Capabilities


class SkillGRPOConfig(GRPOConfig):
    pass


class SkillGRPO(GRPO):
    Config = SkillGRPOConfig
    capabilities: ClassVar[Capabilities] = replace(GRPO.capabilities, uses_skills=True, policy_sees_skills=True)
