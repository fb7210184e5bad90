"""OPD: on-policy distillation, reverse KL to a teacher on the student's own samples
(``docs/methods.md``, "OPD").

Per response token k_t = logS - logT (teacher = a separate, usually larger, model with the same
tokenizer; ``--teacher model:DIR``). Two estimators (``EstimatorSettings``, shared with SAGE-OPD):

- ``full`` (default): the exact KL(pi_theta || pi_T) at each position, sum_v pS(v) (log pS(v) - log pT(v)),
  over the whole vocabulary (``topk: 0``) or over the teacher's top-k tokens (``topk: k``).
- ``sampled`` (the OPD paper's): -k_t, detached, is the token's advantage in the clipped policy-gradient
  loss (coefficient 1, no discount): per token -min(rho A_t, clip(rho) A_t), rho = exp(logS - logOld).

Why ``full`` is the default (``docs/methods.md``, "OPD", and
``benchmarks/results/positive_controls.md``): when the student starts far from the teacher on the
token that decides, the sampled estimator sees the right token only when it is sampled, and its
per-sample advantages (about -12 on a wrong token, +2 on the right one) swamp the signal; on the
positive control it does not learn where ``full`` converges.

Departures: with ``topk: k`` both distributions are renormalized over the teacher's k tokens, so
the term stays a KL (>= 0); ``topk: 0`` is exact but keeps [B, L, V] teacher log-probs in memory
(fine for small vocabularies; use top-k for 150k-token vocabularies). logS in k_t is the current
policy's log-prob, detached; on the first update of a step it equals the sampling log-prob.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import ClassVar, Literal

import torch
from agentkit.objectives.batch import TokenBatch, build_batch
from agentkit.objectives.common import (
    aggregate,
    masked_mean,
    sampled_reverse_kl,
    teacher_logprobs,
    with_teacher,
)
from agentkit.objectives.protocol import Capabilities
from agentkit.objectives.scores import StepScores
from pydantic import BaseModel, ConfigDict, Field

from agentkit.core.trajectory import Trajectory


class EstimatorSettings(BaseModel):
    """How the reverse KL to the teacher is estimated: OPD's, SAGE-OPD's and ``opsd_rkl``'s setting."""

    model_config = ConfigDict(extra="forbid")

    estimator: Literal["sampled", "full"] = Field(
        "full", description="full: the exact reverse KL at each response position (over the vocabulary, or the "
                            "teacher's top-k); sampled: -(logS - logT) of the sampled token as its advantage.")
    topk: int = Field(0, ge=0, description="full estimator: 0 = whole vocabulary, k = the teacher's top k tokens.")
    clip_low: float = Field(0.2, ge=0, description="PPO clip below (sampled estimator).")
    clip_high: float = Field(0.28, ge=0, description="PPO clip above (sampled estimator).")

    def requirements(self, capabilities: Capabilities) -> Capabilities:
        """``capabilities`` with the teacher's support asked for exactly when the estimator needs it."""
        full = self.estimator == "full"
        return replace(capabilities, needs_support=full, topk=self.topk if full else None)


class OPDConfig(EstimatorSettings):
    aggregation: Literal["token-mean", "sequence-mean"] = Field("token-mean", description="Reduction of per-token losses.")


def full_reverse_kl(student: torch.Tensor, teacher: torch.Tensor, renormalize: bool) -> torch.Tensor:
    """[..., K] log-probs over a support -> [...] sum_v pS (log pS - log pT)."""
    if renormalize:
        student = student - torch.logsumexp(student, dim=-1, keepdim=True)
        teacher = teacher - torch.logsumexp(teacher, dim=-1, keepdim=True)
    return (student.exp() * (student - teacher)).sum(dim=-1)


def reverse_kl_per_token(cfg: EstimatorSettings, batch: TokenBatch, logprobs: torch.Tensor,
                         support: torch.Tensor | None, objective: str) -> tuple[torch.Tensor, dict[str, float]]:
    """The per-token reverse-KL loss [B, L] under ``cfg.estimator`` (before aggregation), and its metrics."""
    mask = batch.response_mask  # [B, L]
    logT = teacher_logprobs(batch, objective)  # [B, L]
    metrics = {"reverse_kl": float(masked_mean(logprobs.detach() - logT, mask)),
               "teacher_logprob_mean": float(masked_mean(logT, mask))}
    if cfg.estimator == "sampled":
        per_token, clipped = sampled_reverse_kl(logprobs, batch.old_logprobs, logT, mask, cfg.clip_low,
                                                cfg.clip_high, batch.is_weights)  # [B, L]
        metrics["clip_fraction"] = float(masked_mean(clipped.float(), mask))
        return per_token, metrics
    if support is None or batch.teacher_support_logprobs is None:
        raise ValueError(f"{objective} estimator=full needs the student's and the teacher's support log-probs.")
    # only at response positions: the rest are masked anyway, and the [B, L, V] terms cost
    # a full pass over the vocabulary per position (response tokens are a small share of a row)
    where = mask > 0  # [B, L]
    student = support if support.dim() == 2 else support[where]  # [N, K] (policy_logprobs gives [N, K])
    kl = full_reverse_kl(student, batch.teacher_support_logprobs.detach()[where], renormalize=cfg.topk > 0)  # [N]
    per_token = logprobs.new_zeros(mask.shape).masked_scatter(where, kl)  # [B, L]
    metrics["full_kl"] = float(masked_mean(per_token.detach(), mask))
    return per_token, metrics


class OPD:
    Config = OPDConfig
    # no default teacher: a separate model, --teacher model:DIR. needs_support: with estimator=full (requirements()).
    capabilities: ClassVar[Capabilities] = Capabilities(needs_teacher=True, needs_support=True)

    def __init__(self, config: OPDConfig | None = None) -> None:
        self.config = config or self.Config()

    def requirements(self) -> Capabilities:
        return self.config.requirements(self.capabilities)

    def prepare(self, trajectories: Sequence[Trajectory], scores: StepScores | None = None) -> TokenBatch:
        return with_teacher(build_batch(trajectories), scores, type(self).__name__.lower())

    def loss(self, batch: TokenBatch, logprobs: torch.Tensor,
             support: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        per_token, metrics = reverse_kl_per_token(self.config, batch, logprobs, support, "opd")
        return aggregate(per_token, batch, self.config.aggregation), metrics
