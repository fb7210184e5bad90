"""Loss plugins: one objective per file, pure tensor maths over a shared ``TokenBatch``.

Objectives import only ``agentkit.core`` (and torch, pydantic): the loop runs the teacher and the
judge and hands their results to ``prepare`` as ``StepScores``.
"""

from agentkit.objectives.batch import TokenBatch, build_batch, policy_logprobs, position_logits, sampled_distribution
from agentkit.objectives.protocol import (
    REGISTRY,
    Capabilities,
    Objective,
    capabilities_of,
    describe,
    load_objective,
    make_objective,
    objective_config,
)
from agentkit.objectives.scores import Judgments, StepScores, TeacherScores

__all__ = ["TokenBatch", "build_batch", "policy_logprobs", "position_logits", "sampled_distribution", "Objective", "Capabilities", "REGISTRY", "describe",
           "make_objective", "load_objective", "capabilities_of", "objective_config", "StepScores", "TeacherScores",
           "Judgments"]
