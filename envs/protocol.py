"""The environment contract.

Gymnasium's ``reset``/``step`` with text in and text out, so a ``gymnasium.Env`` with ``Text``
spaces satisfies it. ``info`` always carries the keys in ``INFO_KEYS``:

- ``task``: the goal text.
- ``admissible_actions``: list of valid actions, or None when the environment cannot list them.
- ``action_valid``: the environment executed the last action (True after reset). False on
  unknown commands or malformed model output; SAGE-OPD's deterministic check reads it.
- ``won``: the episode is won.
- ``score``: the environment's own score (cumulative, for display; rewards are differences).
- ``privileged``: text only a teacher may see (expert plan, gold answer), or None.

Rewards are per step, never cumulative.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

INFO_KEYS = ("task", "admissible_actions", "action_valid", "won", "score", "privileged")

StepResult = tuple[str, float, bool, bool, dict[str, Any]]


@runtime_checkable
class Env(Protocol):
    """A turn-based text environment."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode. ``seed`` selects the task (same seed, same task)."""
        ...

    def step(self, action: str) -> StepResult:
        """Play one action; returns (observation, reward, terminated, truncated, info)."""
        ...

    def close(self) -> None:
        """Release processes, files and JVMs."""
        ...
