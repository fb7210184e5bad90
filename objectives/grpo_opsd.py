"""GRPO+OPSD, two ways (``docs/methods.md``, "GRPO+OPSD").

``grpo_opsd`` is the SDAR paper's GRPO+OPSD row: its reference code with ``gate_beta=0``, i.e.
``sdar`` with the gate fixed at sigmoid(0) = 0.5 on every token (lambda 0.01, kl_coef 0.01). The
SDAR paper's numbers for GRPO+OPSD come from this form. With one epoch and one minibatch its
expected gradient on-policy is exactly that of GRPO: E_y~pi[-0.5 grad log pi(y)] = 0, so the
term adds only sampling noise (several epochs or minibatches move the policy off the sampling
distribution and the term then has a small non-zero mean).

``grpo_opsd_rkl`` is the naive hybrid the seed describes ("simply adding the OPSD loss to RL"):
GRPO plus lambda times the reverse-KL self-distillation term of ``opsd_rkl`` (the sampled
estimator: -(logS - logT), detached, as a per-token advantage under the same PPO clip), whose
expected gradient is lambda * grad KL(pi || pi_T), not zero. lambda defaults to 1 ("adding the
loss"); both terms are reduced with the policy loss's aggregation mode.
"""

from __future__ import annotations

import torch
from agentkit.objectives.batch import TokenBatch
from agentkit.objectives.common import (
    masked_mean,
    sampled_reverse_kl,
)
from agentkit.objectives.grpo import GRPOConfig, GRPOWithTeacherTerm
from agentkit.objectives.sdar import SDAR
from pydantic import Field


class GRPOOPSDConfig(GRPOConfig):
    lam: float = Field(0.01, ge=0, description="Weight of the (flat-gated) self-distillation term.")


class GRPOOPSD(SDAR):
    Config = GRPOOPSDConfig

    def beta(self) -> float:
        return 0.0

    def pg_coef(self) -> float:
        return 1.0


class GRPOOPSDRKLConfig(GRPOConfig):
    lam: float = Field(1.0, ge=0, description="Weight of the reverse-KL self-distillation term.")


class GRPOOPSDRKL(GRPOWithTeacherTerm):
    Config = GRPOOPSDRKLConfig

    def term_weight(self) -> float:
        return self.config.lam

    def teacher_term(self, batch: TokenBatch, logprobs: torch.Tensor,
                     logT: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        cfg, mask = self.config, batch.response_mask  # [B, L]
        term, _ = sampled_reverse_kl(logprobs, batch.old_logprobs, logT, mask, cfg.clip_low, cfg.clip_high,
                                     batch.is_weights)  # [B, L]
        return term, {"reverse_kl": float(masked_mean(logprobs.detach() - logT, mask))}
