"""Turn judges for SAGE-OPD: how much should the teacher intervene on each student turn?

Labels: ``skip`` (0), ``weak`` (alpha), ``strong`` (1). Every judge first applies the deterministic
check of SAGE-OPD (``docs/methods.md``): a turn whose action the environment did not execute (malformed,
unparseable, unknown command, invalid tool call: ``action_valid`` False) is ``strong`` without
asking anyone. The rest go to:

- ``teacher``: an LLM (the teacher's weights, or any generation backend) reads a prompt built from
  an editable template file (history, the student's response, the environment's feedback) and
  answers SKIP/WEAK/STRONG. Parsing is forgiving (case, punctuation, a "Label:" prefix, extra words);
  an answer naming no label, or two different ones, is ``strong`` and counted as unparseable.
- ``oracle``: for ablations, compares the action as the environment read it (``Turn.action_read``,
  else the parsed action) with the environment's expert action for that state
  (``Turn.expert_action``): the same action, however worded, is ``skip``; a valid action off the
  expert's plan is ``weak``; with no expert action recorded, ``weak``.

Both count the turns that are valid alternatives (the expert's action in the student's own words)
in ``Judgments.alternatives``, so a run reports how often such a turn is labelled skip.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from agentkit.rollout.context import encode_chat

from agentkit.core.errors import ConfigError
from agentkit.core.scores import LABELS, Judgments
from agentkit.core.trajectory import Trajectory, Turn

DEFAULT_TEMPLATE = Path(__file__).parent / "templates" / "judge.txt"
_LABEL = re.compile(r"\b(skip|weak|strong)\b", re.IGNORECASE)
_PREFIXED = re.compile(r"label\s*[:=]\s*\**\s*(skip|weak|strong)\b", re.IGNORECASE)


def parse_label(text: str) -> str | None:
    """The label in a judge's answer, or None when it names none or contradicts itself."""
    prefixed = _PREFIXED.findall(text)
    if prefixed:
        return prefixed[-1].lower()
    found = {m.lower() for m in _LABEL.findall(text)}
    return found.pop() if len(found) == 1 else None


class TurnJudge(Protocol):
    """Labels every turn of a step's episodes (no gradients)."""

    def judge(self, trajectories: Sequence[Trajectory]) -> Judgments:
        ...


__all__ = ["LABELS", "Judgments", "TurnJudge", "OracleJudge", "LLMJudge", "alternatives", "parse_label"]


def _deterministic(trajectories: Sequence[Trajectory]) -> tuple[list[list[str | None]], list[list[bool]]]:
    labels = [[None if turn.action_valid else "strong" for turn in t.turns] for t in trajectories]
    return labels, [[label is not None for label in episode] for episode in labels]


def _normalize(action: str | None) -> str:
    return " ".join((action or "").lower().split())


def _is_expert(turn: Turn) -> bool:
    """The environment executed the expert's action, as it read it."""
    expert = _normalize(turn.expert_action)
    return turn.action_valid and bool(expert) and _normalize(turn.action_read or turn.action) == expert


def alternatives(trajectories: Sequence[Trajectory]) -> list[list[bool]]:
    """Per turn: the expert's action in the student's own words (read as the expert's, written otherwise)."""
    return [[_is_expert(turn) and _normalize(turn.action) != _normalize(turn.expert_action) for turn in t.turns]
            for t in trajectories]


class OracleJudge:
    """Compares each executed action, as the environment read it, with the expert's action for that state."""

    def judge(self, trajectories: Sequence[Trajectory]) -> Judgments:
        labels, by_check = _deterministic(trajectories)
        for episode, traj in zip(labels, trajectories, strict=True):
            for t, turn in enumerate(traj.turns):
                if episode[t] is None:
                    episode[t] = "skip" if _is_expert(turn) else "weak"
        return Judgments(labels=labels, by_check=by_check, alternatives=alternatives(trajectories))


class LLMJudge:
    """Asks a generation backend for a label per executed turn (greedy, batched).

    Args:
        backend: any generation backend (``HFBackend`` over the teacher, vLLM, OpenAI-compatible).
        template: path of the prompt template (placeholders {task} {history} {response} {feedback}).
        history_turns: earlier turns shown.
        max_new_tokens: answer length.
    """

    def __init__(self, backend, template: str | Path | None = None, *, history_turns: int = 3,
                 max_new_tokens: int = 8, max_chars: int = 600) -> None:
        path = Path(template) if template else DEFAULT_TEMPLATE
        try:
            self.template = path.read_text(encoding="utf-8")
        except OSError as err:
            raise ConfigError(f"Cannot read the judge template {path}: {err}") from err
        missing = [p for p in ("{task}", "{history}", "{response}", "{feedback}") if p not in self.template]
        if missing:
            raise ConfigError(f"Judge template {path} lacks the placeholder(s) {missing}; it needs all of "
                              "{task} {history} {response} {feedback}.")
        self.backend, self.history_turns = backend, history_turns
        self.max_new_tokens, self.max_chars = max_new_tokens, max_chars

    def prompt_text(self, traj: Trajectory, t: int, history_turns: int | None = None) -> str:
        keep = self.history_turns if history_turns is None else history_turns
        cut = self.max_chars
        history = "\n".join(f"Observation: {turn.observation[-cut:]}\nAction: {turn.action or turn.response_text}"
                            for turn in traj.turns[max(0, t - keep): t]) or "(none)"
        turn = traj.turns[t]
        return self.template.format(task=traj.task[:cut], history=history, response=turn.response_text[:cut],
                                    feedback=turn.feedback[-cut:])

    def _prompt_ids(self, traj: Trajectory, t: int) -> list[int]:
        tokenizer = self.backend.tokenizer
        limit = self.backend.max_context - self.max_new_tokens
        for keep in range(self.history_turns, -1, -1):
            ids = encode_chat(tokenizer, [{"role": "user", "content": self.prompt_text(traj, t, keep)}], True)
            if len(ids) <= limit:
                return ids
        return ids[-limit:]  # still too long without history: keep the end (the question)

    def judge(self, trajectories: Sequence[Trajectory]) -> Judgments:
        from agentkit.rollout.backend import SamplingParams

        labels, by_check = _deterministic(trajectories)
        asks = [(e, t) for e, episode in enumerate(labels) for t, label in enumerate(episode) if label is None]
        result = Judgments(labels=labels, by_check=by_check, asked=len(asks), alternatives=alternatives(trajectories))
        if not asks:
            return result
        params = SamplingParams(temperature=0.0, max_new_tokens=self.max_new_tokens)
        prompts = [self._prompt_ids(trajectories[e], t) for e, t in asks]
        generations = self.backend.generate(prompts, params, [0] * len(prompts))
        for (e, t), gen in zip(asks, generations, strict=True):
            text = self.backend.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
            result.answers.append(text)
            label = parse_label(text)
            if label is None:
                result.unparseable += 1
                label = "strong"
            labels[e][t] = label
        return result
