"""SAGE-OPD: verifier-free, turn-level weighted on-policy distillation
(``docs/methods.md``, "SAGE-OPD").

    L = Z * sum_t s_t * L_OPD(h_t, a_t)
    s_t = i_t * c_t
    i_t in {Skip: 0, Weak: alpha, Strong: 1}     (deterministic check first, then the judge)
    c_t = mean over the turn's response positions of the teacher's top-1 probability
    Z   = sum_t |a_t| / sum_t s_t |a_t|          (mean token weight 1; all Skip -> loss 0)

L_OPD is ``opd``'s reverse KL under the same estimator settings (``EstimatorSettings``): ``full``
(default: the exact reverse KL at each response position) or ``sampled`` (the paper's: per token
-min(rho A, clip(rho) A) with A = -(logS - logT) detached). Departure: the paper's L_OPD is the
sampled estimator; the default here is ``full``, because the sampled one does not learn when the
student starts far from the teacher (``objectives/opd.py``); ``estimator: sampled`` is the paper's. The judge (``judge: teacher``) is the teacher's own weights answering the editable prompt
in ``teachers/templates/judge.txt`` (the judge is built by the loop); ``judge: oracle`` compares with the environment's
expert action (ablations). The loop builds the judge from these settings (``requirements()``)
and passes its labels to ``prepare`` with the teacher's scores. Each token's weight Z * s_t is
computed in ``prepare`` and stored in ``batch.weights``.

Ablations (the paper's): ``confidence: false`` gives s_t = i_t; ``normalize: false`` drops Z (Z = 1).

Departure: Z is computed over the step's whole batch (the "batch" of the paper); with
``train.minibatches > 1`` a minibatch's mean weight is then 1 only on average. Metrics: shares of
skip/weak/strong, share decided by the deterministic check, unparseable share, mean c_t, Z.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import ClassVar

import torch
from agentkit.objectives.batch import TokenBatch, build_batch
from agentkit.objectives.common import aggregate, masked_mean, with_teacher
from agentkit.objectives.opd import EstimatorSettings, reverse_kl_per_token
from agentkit.objectives.protocol import Capabilities
from agentkit.objectives.scores import StepScores
from pydantic import Field

from agentkit.core.trajectory import Trajectory


class SAGEOPDConfig(EstimatorSettings):
    alpha: float = Field(0.5, ge=0, le=1, description="Intervention of a Weak turn (Skip 0, Strong 1).")
    judge: str = Field("teacher", pattern=r"^(teacher|oracle|openai:https?://\S+)$",
                       description="Who labels turns: teacher (the teacher LLM), oracle (the expert action), or "
                                   "openai:URL[#MODEL] (an OpenAI-compatible chat server; key from $OPENAI_API_KEY).")
    judge_template: str | None = Field(None, description="Judge prompt template file (default: the shipped one).")
    confidence: bool = Field(True, description="Weight turns by the teacher's confidence c_t (false: the ablation "
                                               "s_t = i_t).")
    normalize: bool = Field(True, description="Rescale by Z to OPD's scale (false: the ablation without Z, Z = 1).")


def turn_scores(labels: torch.Tensor, top1: torch.Tensor, turn_index: torch.Tensor, mask: torch.Tensor,
                alpha: float, use_confidence: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token s_t = i_t * c_t and c_t, both [B, L] (``use_confidence`` false: s_t = i_t).

    labels: [B, L] per response token, 0 skip / 1 weak / 2 strong (its turn's label).
    top1: [B, L] teacher top-1 logprob. turn_index: [B, L] turn of each token (-1 elsewhere).
    """
    intervention = torch.tensor([0.0, alpha, 1.0])[labels.clamp(min=0)] * mask  # [B, L]
    confidence = torch.zeros_like(top1)
    for b in range(top1.shape[0]):
        for t in turn_index[b][mask[b] > 0].unique().tolist():
            here = (turn_index[b] == t) & (mask[b] > 0)  # [L]
            confidence[b, here] = top1[b, here].exp().mean()
    return (intervention * confidence if use_confidence else intervention), confidence


def normalize_weights(s: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Z * s with Z = tokens / sum(s over tokens): mean token weight 1 (all zero stays zero)."""
    total = float((s * mask).sum())
    if total <= 0:
        return torch.zeros_like(s), 0.0
    z = float(mask.sum()) / total
    return z * s * mask, z


class SAGEOPD:
    Config = SAGEOPDConfig
    # no default teacher: a separate, larger model, --teacher model:DIR. needs_support: with estimator=full.
    capabilities: ClassVar[Capabilities] = Capabilities(needs_teacher=True, needs_support=True, needs_judge=True,
                                                        judge="teacher")
    LABEL_IDS = {"skip": 0, "weak": 1, "strong": 2}

    def __init__(self, config: SAGEOPDConfig | None = None) -> None:
        self.config = config or SAGEOPDConfig()

    def requirements(self) -> Capabilities:
        return replace(self.config.requirements(self.capabilities), judge=self.config.judge,
                       judge_template=self.config.judge_template)

    def prepare(self, trajectories: Sequence[Trajectory], scores: StepScores | None = None) -> TokenBatch:
        batch = with_teacher(build_batch(trajectories), scores, "sage_opd")
        judgments = scores.judgments
        if judgments is None:
            raise ValueError("sage_opd needs the turn judgments: pass prepare(trajectories, scores) with scores = "
                             "agentkit.train.scoring.score_step(...) and a judge (the training loop does).")
        mask = batch.response_mask  # [B, L]
        labels = torch.full_like(batch.turn_index, -1)  # [B, L]
        for b in range(batch.num_rows):
            episode = judgments.labels[int(batch.episode_index[b])]
            for t in batch.turn_index[b][mask[b] > 0].unique().tolist():
                labels[b, batch.turn_index[b] == t] = self.LABEL_IDS[episode[t]]
        s, confidence = turn_scores(labels, batch.teacher_top1, batch.turn_index, mask, self.config.alpha,
                                    self.config.confidence)
        weights, z = normalize_weights(s, mask) if self.config.normalize else (s * mask, 1.0)
        turns = [(b, t) for b in range(batch.num_rows) for t in batch.turn_index[b][mask[b] > 0].unique().tolist()]
        c_turns = [float(confidence[b, batch.turn_index[b] == t][0]) for b, t in turns]
        metrics = {**judgments.metrics(), "confidence_mean": sum(c_turns) / max(1, len(c_turns)), "Z": z,
                   "weight_mean": float(masked_mean(weights, mask))}
        signals = {**batch.signals, "label": labels.float(), "confidence": confidence, "weight": weights}
        return replace(batch, weights=weights, metrics={**batch.metrics, **metrics}, signals=signals)

    def loss(self, batch: TokenBatch, logprobs: torch.Tensor,
             support: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        per_token, metrics = reverse_kl_per_token(self.config, batch, logprobs, support, "sage_opd")  # [B, L]
        return aggregate(batch.weights * per_token, batch, "token-mean"), metrics
