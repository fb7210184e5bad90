"""The environment contract.

Gymnasium's ``reset``/``step`` with text in and text out, so a ``gymnasium.Env`` with ``Text``
spaces satisfies it. ``info`` always carries the keys in ``INFO_KEYS``:

- ``task``: the goal text.
- ``admissible_actions``: list of valid actions, or None when the environment cannot list them.
- ``action_valid``: the environment executed the last action (True after reset). False on
  unknown commands or malformed model output; SAGE-OPD's deterministic check reads it.
- ``won``: the episode is won.
- ``score``: the environment's own score (cumulative, for display; rewards are differences).
- ``privileged``: text only a teacher may see (expert plan, gold answer), or None; reported after
  every step too, for the current state (the collector records it per turn, and a teacher shows
  turn t the text of turn t's state).

Optional keys with fixed meaning:

- ``expert_plan``: list of actions that solve the task from the current state (TextWorld's
  policy commands, ALFWorld's planner, ScienceWorld's gold path, Search-QA's search-then-answer).
  ``agentkit envs check`` and ``agentkit demos`` play it; teachers may read it.
- ``error``: set when the episode was cut by a failure outside the game (a crashed worker).
- ``action_read``: the last action as the environment read it, written the way its
  ``admissible_actions`` and ``expert_plan`` write actions (vaults reads ``take the star exit`` as
  ``go star``); None, or absent, when it read none. Judges compare it, not the student's wording,
  with the expert's action, so a valid alternative phrasing counts as the expert's action.

Rewards are per step, never cumulative. ``reset(seed=s)`` picks task ``s`` of the environment's
split deterministically; splits are a constructor argument (``split="train"`` always exists;
held-out splits are named by the adapter, e.g. ``"eval"``, ``"eval_out"``). ``reset()`` plays a
random task (the built-ins, ``gymnasium.Env``s, draw it from ``np_random``: reproducible after a
seeded reset, as Gymnasium asks; envs/gym.py).
"""

from __future__ import annotations

import operator
import os
from collections.abc import Iterable
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


def task_index(seed: Any, num_tasks: int, *, family: str, split: str) -> int:
    """The task a reset seed picks among ``num_tasks`` (a random one for None): ints and numpy
    integers from 0 to num_tasks - 1; anything else is a ``ConfigError`` naming the valid range."""
    from agentkit.core.errors import ConfigError

    if seed is None:
        return int.from_bytes(os.urandom(4), "little") % num_tasks
    try:
        index = operator.index(seed)  # ints and numpy integers
    except TypeError:
        index = -1
    if isinstance(seed, bool) or not 0 <= index < num_tasks:
        raise ConfigError(f"{family} task seeds for split {split!r} run from 0 to {num_tasks - 1}, got {seed!r}.")
    return index


@runtime_checkable
class FiniteTasks(Protocol):
    """An optional capability: the environment's split holds a fixed number of tasks (reset seeds
    0 .. num_tasks - 1), e.g. the questions of a QA file. Commands cap their episode counts at it."""

    @property
    def num_tasks(self) -> int: ...


@runtime_checkable
class PreparesTasks(Protocol):
    """An optional capability: the environment can build the tasks of some seeds up front (games
    generated on first use), showing progress, rather than one by one at each first reset."""

    def prepare(self, seeds: Iterable[int]) -> None: ...
