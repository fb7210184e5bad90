"""What a teacher returns, aligned with a ``TokenBatch``'s target positions."""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
