"""Summarize new skills from successful trajectories with an LLM, deduplicated against the bank.

For each won episode the LLM sees the task and the actions that solved it (template
``skillbank/templates/extract.txt``, editable) and answers ``TITLE: ...`` / ``SKILL: ...``. An answer
without those lines is used whole as the skill text (and counted); an empty one is dropped. A
new skill whose words overlap an existing skill's by ``dedup_threshold`` (Jaccard) or more is a
duplicate and is not added. Skills are credited to their episode (``source``).
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agentkit.skillbank.bank import Skill, SkillBank
from agentkit.skillbank.retrieval import words

from agentkit.core.trajectory import Trajectory

TEMPLATE = Path(__file__).parent / "templates" / "extract.txt"


@dataclass
class ExtractReport:
    added: list[str] = field(default_factory=list)
    duplicates: int = 0
    empty: int = 0
    unformatted: int = 0
    episodes: int = 0


def jaccard(a: str, b: str) -> float:
    x, y = set(words(a)), set(words(b))
    return len(x & y) / len(x | y) if x | y else 1.0


def parse_skill(text: str) -> tuple[str, str, bool]:
    """(title, text, well_formed) from an LLM answer."""
    title = re.search(r"TITLE\s*:\s*(.+)", text, re.IGNORECASE)
    body = re.search(r"SKILL\s*:\s*(.+)", text, re.IGNORECASE | re.DOTALL)
    if title and body:
        return title.group(1).strip(), " ".join(body.group(1).split()), True
    cleaned = " ".join(text.split())
    return " ".join(cleaned.split()[:8]), cleaned, False


def episode_prompt(template: str, traj: Trajectory) -> str:
    actions = "\n".join(f"{i + 1}. {t.action or t.response_text.strip()}" for i, t in enumerate(traj.turns))
    return template.format(task=traj.task, env=traj.env, actions=actions)


def extract_skills(trajectories: Sequence[Trajectory], bank: SkillBank, complete: Callable[[Sequence[str]], list[str]],
                   *, dedup_threshold: float = 0.6, template: str | Path | None = None, source: str = "") -> ExtractReport:
    """Add skills summarized from the won episodes to ``bank`` (in memory; the caller saves).

    ``complete(messages) -> answers`` asks the model: one user message per won episode in, its
    answer out (``agentkit.rollout.backend.chat_completer(backend, max_new_tokens)`` makes one
    from a generation backend; greedy, so the same episodes give the same answers).
    """
    text = Path(template or TEMPLATE).read_text(encoding="utf-8")
    report = ExtractReport()
    won = [t for t in trajectories if t.won]
    report.episodes = len(won)
    if not won:
        return report
    answers = complete([episode_prompt(text, traj) for traj in won])
    for traj, answer in zip(won, answers, strict=True):
        title, body, formed = parse_skill(answer)
        if not body.strip() or not words(body):
            report.empty += 1
            continue
        report.unformatted += not formed
        if any(jaccard(body, s.text) >= dedup_threshold for s in bank):
            report.duplicates += 1
            continue
        digest = hashlib.blake2b(body.encode(), digest_size=4).hexdigest()
        keywords = [w for w, _ in Counter(words(traj.task + " " + body)).most_common(6)]
        skill = Skill(id=f"extracted.{digest}", title=title or "extracted skill", text=body, keywords=keywords,
                      applies_to=[traj.env], source=f"extracted:{source}#{traj.id}")
        bank.add(skill)
        report.added.append(skill.id)
    return report
