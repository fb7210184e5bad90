"""Per-token teacher signals of a training step, for a sample of episodes (``agentkit view``).

For each sampled episode and turn: the teacher's logprob of every response token, the
teacher-student gap (teacher minus the student's logprob at sampling), the teacher's top-1
confidence (its top-1 probability), and whatever the objective put in ``batch.signals`` (SDAR's
gate; SAGE-OPD's turn label, confidence and weight). Values are rounded to 4 decimals and written
to ``RUN_DIR/signals/step-N.jsonl``, apart from the trajectories, so those stay as they were.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch

from agentkit.core.trajectory import Trajectory

LABELS = ("skip", "weak", "strong")  # SAGE-OPD's label ids
TURN_LEVEL = ("label", "confidence", "weight")  # one value per turn


def _values(tensor: torch.Tensor, where: torch.Tensor) -> list[float]:
    return [round(float(v), 4) for v in tensor[where].tolist()]


def episode_signals(batch, trajectories: Sequence[Trajectory], *, episodes: int, rng: random.Random) -> list[dict[str, Any]]:
    """Signal records for up to ``episodes`` episodes of ``batch`` (built from ``trajectories``,
    in that order). Empty when the batch carries no teacher scores and no objective signals."""
    per_token: dict[str, torch.Tensor] = {}
    if batch.teacher_logprobs is not None:
        per_token["teacher"] = batch.teacher_logprobs
        per_token["gap"] = batch.teacher_logprobs - batch.old_logprobs
    if batch.teacher_top1 is not None:
        per_token["top1"] = batch.teacher_top1.exp()
    per_token.update(batch.signals)
    if episodes <= 0 or not per_token:
        return []
    chosen = sorted(rng.sample(range(len(trajectories)), min(episodes, len(trajectories))))
    records = []
    for episode in chosen:
        trajectory = trajectories[episode]
        turns: dict[int, dict[str, Any]] = {}
        for row in (batch.episode_index == episode).nonzero().flatten().tolist():
            mask = batch.response_mask[row] > 0  # [L]
            for t in batch.turn_index[row][mask].unique().tolist():
                where = mask & (batch.turn_index[row] == t)  # this turn's response tokens, in order
                if int(where.sum()) != len(trajectory.turns[t].response_ids):
                    continue  # not aligned with the recorded tokens: leave the turn out
                turn: dict[str, Any] = {"turn": t}
                for key, tensor in per_token.items():
                    values = _values(tensor[row], where)
                    if key in TURN_LEVEL:
                        turn[key] = LABELS[int(values[0])] if key == "label" and 0 <= values[0] < len(LABELS) \
                            else (None if key == "label" else values[0])
                    else:
                        turn[key] = values
                turns[t] = turn
        records.append({"id": trajectory.id, "turns": [turns[t] for t in sorted(turns)]})
    return records
