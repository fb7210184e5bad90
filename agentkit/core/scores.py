"""What the training loop hands an objective besides the trajectories: the teacher's per-token
scores and the turn judgments of one step.

The loop (``agentkit.train.scoring``) runs the teacher and the judge, without gradients; objectives
only read the results, so they stay pure tensor maths and never import a teacher. The tensors
are aligned with ``build_batch(trajectories)``'s target positions (the layout every objective's
batch shares).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

LABELS = ("skip", "weak", "strong")


@dataclass(frozen=True)
class TeacherScores:
    """Per response token of a batch (0 elsewhere).

    Attributes:
        logprobs: [B, L] teacher log-prob of the token the student sampled.
        top1: [B, L] teacher log-prob of its own most likely token at that position.
        support_ids: [B, L, K] the teacher's top-k token ids, or None when ``support_logprobs``
            covers the whole vocabulary.
        support_logprobs: [B, L, K] (or [B, L, V]) the teacher's log-probs there; None unless asked.
    """

    logprobs: torch.Tensor
    top1: torch.Tensor
    support_ids: torch.Tensor | None = None
    support_logprobs: torch.Tensor | None = None


@dataclass
class Judgments:
    """Labels (``LABELS``) per episode and turn, and how they were decided.

    Attributes:
        labels: per episode, per turn: "skip", "weak" or "strong".
        by_check: per episode, per turn: decided by the deterministic execution-failure check.
        asked: turns sent to an LLM judge.
        unparseable: of those, answers with no usable label (counted as strong).
        answers: the LLM judge's raw answers, in the order asked.
        alternatives: per episode, per turn: the student worded the expert's action its own way
            (the environment read it as the expert's action, ``Turn.action_read``, from other text),
            SAGE-OPD's "semantically valid alternative"; empty when not computed.
    """

    labels: list[list[str]]
    by_check: list[list[bool]]
    asked: int = 0
    unparseable: int = 0
    answers: list[str] = field(default_factory=list)
    alternatives: list[list[bool]] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """Label shares over all turns; ``judge_alternative_share``: the share of turns that are
        valid alternatives; ``judge_alternative_skip_share``: of those, the share labelled skip
        (only when there are some)."""
        flat = [label for episode in self.labels for label in episode]
        total = max(1, len(flat))
        checked = sum(sum(episode) for episode in self.by_check)
        out = {f"judge_{label}_share": flat.count(label) / total for label in LABELS}
        out["judge_check_share"] = checked / total
        out["judge_unparseable_share"] = self.unparseable / max(1, self.asked)
        marked = self.alternatives or [[False] * len(labels) for labels in self.labels]
        alternative = [label for labels, marks in zip(self.labels, marked, strict=True)
                       for label, mark in zip(labels, marks, strict=True) if mark]
        out["judge_alternative_share"] = len(alternative) / total
        if alternative:
            out["judge_alternative_skip_share"] = alternative.count("skip") / len(alternative)
        return out


@dataclass(frozen=True)
class StepScores:
    """The loop's no-gradient signals for one step, passed to ``objective.prepare``.

    Attributes:
        teacher: the teacher's scores of the step's response tokens (objectives that need a teacher).
        judgments: the turn labels (objectives that need a judge).
        step: the 1-based training step the trajectories were collected at (schedules such as
            RLSD's decaying lambda read it).
    """

    teacher: TeacherScores | None = None
    judgments: Judgments | None = None
    step: int = 1
