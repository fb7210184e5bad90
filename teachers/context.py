"""Privileged context: the text only a teacher sees, and how it enters the teacher's tokens.

The block is rendered as one extra chat message (role ``system``) with the tokenizer's own
template and placed *before* the student's sequence: teacher input = block + student's
context and response ids, unchanged. Every chat template renders a lone system message, the
student's tokens are never re-tokenized, and one forward pass scores every turn of a chat-mode
episode. (METHODS.md puts the block "before the task prompt"; this is before the system prompt
that precedes it, which keeps it out of the student's token stream entirely.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentkit.skillbank.bank import SkillBank, render_skills

from agentkit.core.trajectory import Trajectory

SOURCES = ("skills", "env")
SKILLS_HEADER = "[Privileged Skill Information]"
ENV_HEADER = "[Privileged Environment Information]"


def privileged_text(trajectory: Trajectory, sources: Sequence[str], bank: SkillBank | None) -> str | None:
    """The labelled privileged block for one episode, or None when there is nothing to show."""
    parts = []
    if "skills" in sources and bank is not None and trajectory.skills:
        skills = [bank.get(i) for i in trajectory.skills if i in {s.id for s in bank}]
        if skills:
            parts.append(render_skills(skills, SKILLS_HEADER))
    if "env" in sources and trajectory.privileged:
        parts.append(f"{ENV_HEADER}\n{trajectory.privileged}")
    return "\n\n".join(parts) if parts else None


def prefix_ids(tokenizer: Any, text: str | None) -> list[int]:
    """Token ids of the privileged block as a chat message ([] for no block)."""
    if not text:
        return []
    rendered = tokenizer.apply_chat_template([{"role": "system", "content": text}], tokenize=False,
                                             add_generation_prompt=False)
    return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
