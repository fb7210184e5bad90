"""Privileged context: the text only a teacher sees, and how it enters the teacher's tokens.

The block is rendered as one extra chat message (role ``system``) with the tokenizer's own
template and placed *before* the student's sequence: teacher input = block + student's
context and response ids, unchanged. Every chat template renders a lone system message and the
student's tokens are never re-tokenized. (The SDAR paper's code prepends the raw text before the
rendered prompt and re-encodes it; this is before the system prompt, as a message of its own,
which keeps it out of the student's token stream entirely: ``docs/methods.md``, "SDAR".)

The environment's part of the block is that of the turn being scored: ``Turn.privileged``, the
environment's text for the state the turn answered. Where an environment replans (TextWorld,
ALFWorld, WebShop, Search-QA, vaults), that is the expert's plan from there, so after the student
leaves the reset's plan the teacher still knows the way from where the student is. ScienceWorld's
is its gold sequence from the start, the same every turn. A turn without one (files written
before turns recorded it, environments that give it only at reset) shows the reset's
(``Trajectory.privileged``).

What it costs (``teacher_sequences``): the teacher scores turn t from turn t's block followed by
the student's ids up to turn t's response. In window mode a row is one turn, so that is one pass
per row, as without the environment's text. In chat mode a row is the whole episode: consecutive
turns with the same block share one pass (the block, then the ids up to the last of those turns'
responses), and each change of block starts another, so an episode whose plan changes every turn
costs T passes over 1..T turns, O(T^2) tokens instead of O(T). Skills alone never change within
an episode: one pass per row, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentkit.rollout.context import encode_chat
from agentkit.skillbank.bank import SkillBank, render_skills

from agentkit.core.trajectory import Trajectory

if TYPE_CHECKING:  # the batch layout objectives build; teachers only read its tensors
    from agentkit.objectives.batch import TokenBatch

SOURCES = ("skills", "env")
SKILLS_HEADER = "[Privileged Skill Information]"
ENV_HEADER = "[Privileged Environment Information]"


def privileged_text(trajectory: Trajectory, sources: Sequence[str], bank: SkillBank | None,
                    turn: int | None = None) -> str | None:
    """The labelled privileged block for one episode, or None when there is nothing to show.

    ``turn``: the block for that turn (the environment's text for its state, ``Turn.privileged``,
    else the reset's); None: the block at reset.
    """
    return _turn_texts(trajectory, sources, bank, [turn])[0]


def turn_texts(trajectory: Trajectory, sources: Sequence[str], bank: SkillBank | None) -> list[str | None]:
    """``privileged_text`` of each of the episode's turns, in order."""
    return _turn_texts(trajectory, sources, bank, range(len(trajectory.turns)))


def _turn_texts(trajectory: Trajectory, sources: Sequence[str], bank: SkillBank | None,
                turns: Sequence[int | None]) -> list[str | None]:
    skill_part = None
    if "skills" in sources and bank is not None and trajectory.skills:
        skills = [bank.get(i) for i in trajectory.skills if i in {s.id for s in bank}]
        if skills:
            skill_part = render_skills(skills, SKILLS_HEADER)
    texts = []
    for turn in turns:
        parts = [skill_part] if skill_part else []
        env_text = trajectory.privileged
        if turn is not None and trajectory.turns[turn].privileged is not None:
            env_text = trajectory.turns[turn].privileged
        if "env" in sources and env_text:
            parts.append(f"{ENV_HEADER}\n{env_text}")
        texts.append("\n\n".join(parts) if parts else None)
    return texts


def prefix_ids(tokenizer: Any, text: str | None) -> list[int]:
    """Token ids of the privileged block as a chat message ([] for no block)."""
    if not text:
        return []
    return encode_chat(tokenizer, [{"role": "system", "content": text}], False)


@dataclass(frozen=True)
class TeacherSequence:
    """One sequence a teacher runs: ``prefix`` (a privileged block's ids), then the first ``length``
    ids of batch row ``row``; it scores that row's response ``columns`` (``TokenBatch`` columns:
    column t predicts ``input_ids[row, t + 1]``, at position ``len(prefix) + t`` here)."""

    row: int
    prefix: list[int]
    length: int
    columns: list[int]


def teacher_sequences(batch: TokenBatch, trajectories: Sequence[Trajectory], sources: Sequence[str],
                      bank: SkillBank | None, tokenizer: Any) -> list[TeacherSequence]:
    """What a teacher runs to score ``batch`` (``build_batch(trajectories)``): each response token
    behind the block of its own turn (the module docstring says what it costs).

    Without the environment's text the block is the episode's: one sequence per row, the whole
    row. With it, a row's response columns are cut into runs of consecutive turns that share a
    block; each run is one sequence, cut after its last column's target token (the row's last run
    keeps the whole row, so a block that never changes gives one sequence per row, as without it).
    """
    lengths = batch.attention_mask.sum(dim=1).tolist()
    episodes = batch.episode_index.tolist()
    encoded: dict[str | None, list[int]] = {}

    def block(text: str | None) -> list[int]:
        if text not in encoded:
            encoded[text] = prefix_ids(tokenizer, text)
        return encoded[text]

    if "env" not in sources:
        blocks = [block(privileged_text(t, sources, bank)) for t in trajectories]
        return [TeacherSequence(r, blocks[e], lengths[r], _columns(batch, r)) for r, e in enumerate(episodes)]
    texts = [turn_texts(t, sources, bank) for t in trajectories]
    sequences = []
    for r, e in enumerate(episodes):
        columns = _columns(batch, r)
        column_texts = [texts[e][turn] for turn in batch.turn_index[r, columns].tolist()]
        start = 0
        for end in range(1, len(columns) + 1):
            if end < len(columns) and column_texts[end] == column_texts[start]:
                continue
            # through the last column's target token: a prompt_logprobs teacher scores that token itself
            length = lengths[r] if end == len(columns) else columns[end - 1] + 2
            sequences.append(TeacherSequence(r, block(column_texts[start]), length, columns[start:end]))
            start = end
    return sequences


def _columns(batch: TokenBatch, row: int) -> list[int]:
    """The row's response columns, in order."""
    return batch.response_mask[row].nonzero().squeeze(1).tolist()
