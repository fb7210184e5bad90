"""Behaviour shared by every environment: turn limit, action parsing, observation cleanup.

Adapters implement only the game; these wrappers add the rest, so every environment counts
turns, parses model output and cleans text the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from agentkit.envs.protocol import Env, StepResult


class Wrapper:
    """Forwards everything to the wrapped environment; subclasses override what they change."""

    def __init__(self, env: Env) -> None:
        self.env = env

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        return self.env.reset(seed=seed, options=options)

    def step(self, action: str) -> StepResult:
        return self.env.step(action)

    def close(self) -> None:
        self.env.close()

    @property
    def unwrapped(self) -> Env:
        env = self.env
        while isinstance(env, Wrapper):
            env = env.env
        return env

    def __getattr__(self, name: str) -> Any:
        # reached only when normal lookup fails: expose the adapter's extra attributes
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.env, name)


class TurnLimit(Wrapper):
    """Truncate the episode after ``max_turns`` steps."""

    def __init__(self, env: Env, max_turns: int) -> None:
        super().__init__(env)
        if max_turns <= 0:
            raise ValueError(f"max_turns must be positive, got {max_turns}")
        self.max_turns = max_turns
        self.turns = 0

    def reset(self, *, seed=None, options=None):
        self.turns = 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action: str) -> StepResult:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.turns += 1
        if self.turns >= self.max_turns and not terminated:
            truncated = True
        return obs, reward, terminated, truncated, info


_PROMPT_TAIL = re.compile(r"\n\s*>\s*[^\n]*\Z")
_BLANK_RUNS = re.compile(r"\n{3,}")


def clean_text(text: str) -> str:
    """Strip prompt characters, padding and runs of blank lines from game text."""
    text = text.replace("\r\n", "\n").replace("\x00", "")
    text = _PROMPT_TAIL.sub("", text.rstrip())
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return _BLANK_RUNS.sub("\n\n", text).strip()


class CleanObservation(Wrapper):
    """Apply ``clean_text`` to every observation and to ``info['task']``."""

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        return clean_text(obs), info

    def step(self, action: str) -> StepResult:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return clean_text(obs), reward, terminated, truncated, info


@dataclass(frozen=True)
class ActionParser:
    """Extract the action from model text.

    Attributes:
        pattern: a regex whose first group is the action. The default takes the content of the
            *last* ``<action>...</action>`` (models often restate earlier attempts).
        require_match: when False, text with no match is used whole as the action (useful for
            models trained to answer with the bare command).
        max_length: longer actions are rejected as invalid.
    """

    pattern: str = r"<action>(.*?)</action>"
    require_match: bool = True
    max_length: int = 300

    def parse(self, text: str) -> str | None:
        """Return the action, or None when the text holds no usable action."""
        if not isinstance(text, str):
            return None
        matches = re.findall(self.pattern, text, flags=re.DOTALL | re.IGNORECASE)
        if matches:
            candidate = matches[-1]
            if isinstance(candidate, tuple):
                candidate = candidate[0]
        elif self.require_match:
            return None
        else:
            candidate = text
        candidate = " ".join(_printable(candidate).split())
        if not candidate or len(candidate) > self.max_length:
            return None
        return candidate


def _printable(text: str) -> str:
    # control characters and lone surrogates, which environments choke on, become spaces: deleting
    # them would join the pieces around them into a command the model never wrote ("lo\x00ok")
    if text.isascii() and text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else " " for ch in text)


INVALID_FORMAT_FEEDBACK = "Invalid action: no action found. Answer with <action>your command</action>."


class ParseAction(Wrapper):
    """Turn model text into an environment action.

    Unparseable text never reaches the environment and never raises: the turn is an invalid
    action (``action_valid=False``, reward 0) and the observation tells the model the format.
    ``info['action']`` holds the parsed action (None when unparseable). ``feedback`` is that
    observation (the environment's action format says it).
    """

    def __init__(self, env: Env, parser: ActionParser | None = None, feedback: str = INVALID_FORMAT_FEEDBACK) -> None:
        super().__init__(env)
        self.parser = parser or ActionParser()
        self.feedback = feedback
        self._last_info: dict[str, Any] = {}

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._last_info = dict(info)
        return obs, {**info, "action": None}

    def step(self, action: str) -> StepResult:
        parsed = self.parser.parse(action)
        if parsed is None:  # the state's keys stay; nothing was read
            info = {**self._last_info, "action_valid": False, "action": None, "action_read": None}
            return self.feedback, 0.0, False, False, info
        obs, reward, terminated, truncated, info = self.env.step(parsed)
        self._last_info = dict(info)
        return obs, reward, terminated, truncated, {**info, "action": parsed}
