"""Loss plugins: one objective per file, pure tensor maths over a shared ``TokenBatch``."""

from agentkit.objectives.batch import TokenBatch, build_batch, policy_logprobs
from agentkit.objectives.protocol import REGISTRY, Objective, describe, make_objective

__all__ = ["TokenBatch", "build_batch", "policy_logprobs", "Objective", "REGISTRY", "describe", "make_objective"]
