"""Token-in / token-out context assembly for the two context modes.

``chat``: one growing conversation. Turn 0's context is the chat template applied to the system
prompt and the first observation; every later turn adds only the tokens that close the previous
answer and open the next user message. The sampled ids are never decoded and re-encoded, so the
concatenation of all turns' ``context_ids + response_ids`` is exactly what the model saw.

``window``: every turn is a fresh prompt holding the task, the last k (observation, action)
pairs and the current observation (verl-agent's "memory" prompt). Cheaper for long episodes.

Both are a ``ContextBuilder`` (``make_context(mode, ...)`` picks one), so the collector and the
demonstrations assemble turns the same way without asking which mode they are in. The chat
deltas are derived from the tokenizer's own chat template (rendered once with placeholders), so
any template that renders a conversation by appending messages works.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentkit.envs.formats import ACTION_TAG

from agentkit.core.errors import ConfigError, ModelError
from agentkit.core.settings import ContextSettings, default
from agentkit.core.trajectory import ContextMode

DEFAULT_SYSTEM_PROMPT = ACTION_TAG.instruction  # the <action> format's instruction; each env's is env_info(id).action_format

_ASSISTANT_MARK = "\u2063ASSISTANT\u2063"
_USER_MARK = "\u2063USER\u2063"


def _render(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def _special_pattern(tokenizer: Any) -> re.Pattern[str]:
    """The tokenizer's special tokens (``<|im_start|>``, ``<|im_end|>``, ...) as one pattern, longest first."""
    specials = sorted({str(t) for t in tokenizer.all_special_tokens}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, specials)) if specials else r"(?!)")


def encode_data(tokenizer: Any, text: str) -> list[int]:
    """Encode text that is data (an observation, a task, a skill, a retrieved passage, a model's
    action): special tokens written in it are ordinary characters, never control tokens."""
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


def encode_segments(tokenizer: Any, segments: Sequence[tuple[str, bool]]) -> list[int]:
    """Encode ``(text, is_data)`` pieces as one text in which only the markup pieces may hold special
    tokens. The text between two special tokens is encoded as a whole (as the tokenizer would
    encode the joined string), so a conversation without forged markup gets exactly the ids of
    ``tokenizer(joined text)``; a data piece that spells ``<|im_end|>`` gets the ids of its characters."""
    pattern = _special_pattern(tokenizer)
    ids: list[int] = []
    plain: list[str] = []

    def flush() -> None:
        if plain:
            ids.extend(encode_data(tokenizer, "".join(plain)))
            plain.clear()

    for text, is_data in segments:
        if is_data:
            plain.append(text)
            continue
        at = 0
        for match in pattern.finditer(text):
            plain.append(text[at:match.start()])
            flush()
            ids.append(tokenizer.convert_tokens_to_ids(match.group()))
            at = match.end()
        plain.append(text[at:])
    flush()
    return ids


def _slot(i: int) -> str:
    return f"\u2063SLOT{i}\u2063"


def encode_chat(tokenizer: Any, messages: Sequence[dict[str, str]], add_generation_prompt: bool) -> list[int]:
    """The chat template applied to ``messages``, encoded so that only the template's own markup
    makes special tokens: every message's content is data (``encode_segments``).

    The template is rendered once with a placeholder for each content, which marks where the
    markup ends and the data begins; a template that changes a content on the way (Llama's
    ``| trim``) is honoured: the content is read back from a render with the real text."""
    marked = _render(tokenizer, [{**m, "content": _slot(i)} for i, m in enumerate(messages)], add_generation_prompt)
    pieces = re.split("(\u2063SLOT\\d+\u2063)", marked)
    if pieces[1::2] != [_slot(i) for i in range(len(messages))]:
        raise ModelError("This tokenizer's chat template does not render each message's content once and in order, "
                         "so the markup cannot be told from the data. Use a model whose chat template does.")
    contents = [str(m["content"]) for m in messages]
    markup = pieces[0::2]
    if _render(tokenizer, list(messages), add_generation_prompt) != "".join(
            part for pair in zip(markup, [*contents, ""], strict=True) for part in pair):
        # the template rewrites contents: read each one back from a render with only it filled in
        for i in range(len(messages)):
            one = _render(tokenizer, [{**m, "content": m["content"] if j == i else _slot(j)}
                                      for j, m in enumerate(messages)], add_generation_prompt)
            before, after = marked.split(_slot(i))
            if not (one.startswith(before) and one.endswith(after)) or len(one) < len(before) + len(after):
                raise ModelError("This tokenizer's chat template changes the text around a message depending on "
                                 "its content, so the markup cannot be told from the data.")
            contents[i] = one[len(before):len(one) - len(after)]
    segments: list[tuple[str, bool]] = [(markup[0], False)]
    for content, text in zip(contents, markup[1:], strict=True):
        segments += [(content, True), (text, False)]
    return encode_segments(tokenizer, segments)


@dataclass
class EpisodeContext:
    """One episode's context so far (``ContextBuilder.start`` makes it).

    Attributes:
        task: the goal text (window prompts repeat it).
        prefix: text put before the observation of the first turn (chat) or of every turn
            (window), e.g. the skills a skill-conditioned policy sees; None for none.
        turns: turns played so far.
        tokens: chat mode: every token of the conversation so far.
        history: window mode: the (observation, action) of every turn so far.
        last_response: the previous turn's sampled ids.
        prompt: what the model is prompted with this turn (after ``next_turn``).
    """

    task: str
    prefix: str | None = None
    turns: int = 0
    tokens: list[int] = field(default_factory=list)
    history: list[tuple[str, str]] = field(default_factory=list)
    last_response: list[int] = field(default_factory=list)
    prompt: list[int] = field(default_factory=list)


@runtime_checkable
class ContextBuilder(Protocol):
    """Assembles each turn's prompt for one context mode.

    Attributes:
        mode: the ``context_mode`` trajectories record.
        system_prompt: the system message of every prompt.
    """

    mode: ContextMode
    system_prompt: str

    def start(self, task: str, prefix: str | None = None) -> EpisodeContext:
        """A new episode's state."""
        ...

    def next_turn(self, state: EpisodeContext, user_text: str) -> list[int]:
        """Add this turn's user message; return the turn's new context ids (``Turn.context_ids``)
        and set ``state.prompt`` to the ids the model is prompted with."""
        ...

    def end_turn(self, state: EpisodeContext, observation: str, action: str, response_ids: Sequence[int]) -> None:
        """Record the answer to the turn: the response ids sampled, and the action it made."""
        ...


class ChatContext:
    """Builds each turn's new context tokens for a growing conversation."""

    mode: ContextMode = "chat"

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
        between_ids = encode_segments(tokenizer, [(self._between, False)])
        # when the model itself sampled the end-of-turn token, it is not added a second time
        self._closing_token = between_ids[0] if between_ids and between_ids[0] == eos else None

    def first(self, user_text: str) -> list[int]:
        messages = [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": user_text}]
        return encode_chat(self.tokenizer, messages, True)

    def next(self, response_ids: Sequence[int], user_text: str) -> list[int]:
        ids = encode_segments(self.tokenizer, [(self._between, False), (user_text, True), (self._after, False)])
        if self._closing_token is not None and response_ids and response_ids[-1] == self._closing_token:
            ids = ids[1:]
        return ids

    def start(self, task: str, prefix: str | None = None) -> EpisodeContext:
        return EpisodeContext(task, prefix)

    def next_turn(self, state: EpisodeContext, user_text: str) -> list[int]:
        if state.turns == 0:
            ids = self.first(f"{state.prefix}\n\n{user_text}" if state.prefix else user_text)
        else:
            ids = self.next(state.last_response, user_text)
        state.tokens.extend(ids)
        state.prompt = state.tokens
        return ids

    def end_turn(self, state: EpisodeContext, observation: str, action: str, response_ids: Sequence[int]) -> None:
        state.tokens.extend(response_ids)
        state.last_response = list(response_ids)
        state.turns += 1


class WindowContext:
    """Builds a fresh prompt each turn from the task, the last ``window`` turns and the observation."""

    mode: ContextMode = "window"

    def __init__(self, tokenizer: Any, system_prompt: str = DEFAULT_SYSTEM_PROMPT, window: int = default(ContextSettings, "window")) -> None:
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
        return encode_chat(self.tokenizer, messages, True)

    def start(self, task: str, prefix: str | None = None) -> EpisodeContext:
        return EpisodeContext(task, prefix)

    def next_turn(self, state: EpisodeContext, user_text: str) -> list[int]:
        # every prompt stands alone, so the prefix comes with every turn
        text = f"{state.prefix}\n\n{user_text}" if state.prefix else user_text
        state.prompt = self.prompt(state.task, state.history, text, state.turns)
        return state.prompt

    def end_turn(self, state: EpisodeContext, observation: str, action: str, response_ids: Sequence[int]) -> None:
        state.history.append((observation, action))
        state.last_response = list(response_ids)
        state.turns += 1


CONTEXT_MODES: tuple[ContextMode, ...] = ("chat", "window")


def make_context(mode: ContextMode, tokenizer: Any, system_prompt: str = DEFAULT_SYSTEM_PROMPT,
                 window: int = default(ContextSettings, "window")) -> ContextBuilder:
    """The builder of one context mode: ``chat`` or ``window`` (``window`` turns of history)."""
    if mode == "chat":
        return ChatContext(tokenizer, system_prompt)
    if mode == "window":
        return WindowContext(tokenizer, system_prompt, window)
    raise ConfigError(f"context mode must be one of {list(CONTEXT_MODES)}, got {mode!r}.")


def task_type_of(info: dict[str, Any]) -> str | None:
    """The task's type as the environment names it at reset (``info['task_type']`` or ``'task_name'``)."""
    return str(info.get("task_type") or info.get("task_name") or "") or None


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
