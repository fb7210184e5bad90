"""Token-in / token-out context assembly for the two context modes.

``chat``: one growing conversation. Turn 0's context is the chat template applied to the system
prompt and the first observation; every later turn adds only the tokens that close the previous
answer and open the next user message. The sampled ids are never decoded and re-encoded, so the
concatenation of all turns' ``context_ids + response_ids`` is exactly what the model saw.

``window``: every turn is a fresh prompt holding the task, the last k (observation, action)
pairs and the current observation (verl-agent's "memory" prompt). Cheaper for long episodes.

The chat deltas are derived from the tokenizer's own chat template (rendered once with
placeholders), so any template that renders a conversation by appending messages works.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentkit.core.errors import ModelError

DEFAULT_SYSTEM_PROMPT = (
    "You are an agent in a text environment. Read the observation, then answer with exactly one "
    "command inside <action></action> tags, for example <action>go north</action>."
)

_ASSISTANT_MARK = "\u2063ASSISTANT\u2063"
_USER_MARK = "\u2063USER\u2063"


def _render(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def encode(tokenizer: Any, text: str) -> list[int]:
    """Encode template-rendered text: special tokens in the text are parsed, none are added."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


class ChatContext:
    """Builds each turn's new context tokens for a growing conversation."""

    def __init__(self, tokenizer: Any, system_prompt: str = DEFAULT_SYSTEM_PROMPT) -> None:
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        base = [{"role": "system", "content": system_prompt}, {"role": "user", "content": "u"}]
        with_answer = _render(tokenizer, [*base, {"role": "assistant", "content": _ASSISTANT_MARK}], False)
        with_next = _render(
            tokenizer,
            [*base, {"role": "assistant", "content": _ASSISTANT_MARK}, {"role": "user", "content": _USER_MARK}],
            True,
        )
        cut = with_answer.find(_ASSISTANT_MARK) + len(_ASSISTANT_MARK)
        if cut < len(_ASSISTANT_MARK) or not with_next.startswith(with_answer[:cut]) or _USER_MARK not in with_next:
            raise ModelError(
                "This tokenizer's chat template does not render a conversation by appending messages, so "
                "chat mode cannot stay token-exact. Use --context window."
            )
        # text that follows the assistant's content up to the next user content, and after it
        self._between, self._after = with_next[cut:].split(_USER_MARK)
        eos = tokenizer.eos_token_id
        between_ids = encode(tokenizer, self._between)
        # when the model itself sampled the end-of-turn token, it is not added a second time
        self._closing_token = between_ids[0] if between_ids and between_ids[0] == eos else None

    def first(self, user_text: str) -> list[int]:
        messages = [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": user_text}]
        return encode(self.tokenizer, _render(self.tokenizer, messages, True))

    def next(self, response_ids: Sequence[int], user_text: str) -> list[int]:
        ids = encode(self.tokenizer, self._between + user_text + self._after)
        if self._closing_token is not None and response_ids and response_ids[-1] == self._closing_token:
            ids = ids[1:]
        return ids


class WindowContext:
    """Builds a fresh prompt each turn from the task, the last ``window`` turns and the observation."""

    def __init__(self, tokenizer: Any, system_prompt: str = DEFAULT_SYSTEM_PROMPT, window: int = 3) -> None:
        if window < 0:
            raise ValueError(f"window must be >= 0, got {window}")
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.window = window

    def prompt(self, task: str, history: Sequence[tuple[str, str]], observation: str, step: int) -> list[int]:
        parts = [f"Task: {task}"] if task else []
        recent = list(history)[-self.window:] if self.window else []
        if recent:
            first = step - len(recent)
            lines = [f"Recent history ({len(recent)} of {step} steps):"]
            for i, (obs, action) in enumerate(recent):
                lines.append(f"[Step {first + i + 1}] Observation: {obs}\nAction: {action}")
            parts.append("\n".join(lines))
        parts.append(f"Current observation (step {step + 1}):\n{observation}")
        messages = [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": "\n\n".join(parts)}]
        return encode(self.tokenizer, _render(self.tokenizer, messages, True))


def format_observation(observation: str, info: dict[str, Any], *, show_admissible: bool, first: bool) -> str:
    """The user message for one turn: the task on the first turn (if the text lacks it), the
    observation, and the admissible actions when the environment lists them."""
    text = observation
    task = info.get("task") or ""
    if first and task and task not in observation:
        text = f"Task: {task}\n\n{observation}"
    actions = info.get("admissible_actions")
    if show_admissible and actions:
        text += "\n\nAvailable actions: " + ", ".join(actions)
    return text
