"""A combination lock: turn the dials in the right order to open it.

A plain ``gymnasium.Env`` with ``Text`` spaces: agentkit needs nothing else from a plugin.
"""

from __future__ import annotations

import random

import gymnasium as gym
from gymnasium.spaces import Text

COLOURS = ["red", "green", "blue", "yellow", "white", "black"]


class CombinationLock(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, length: int = 3, split: str = "train") -> None:
        self.length = length
        self.split = split
        self.observation_space = Text(max_length=2000)
        self.action_space = Text(max_length=100)
        self._code: list[str] = []
        self._progress = 0

    def _info(self, valid: bool) -> dict:
        return {
            "task": "Open the lock by turning the dials in the order written on the note.",
            "admissible_actions": [f"turn {c}" for c in COLOURS] + ["read note"],
            "action_valid": valid,
            "won": self._progress == self.length,
            "score": float(self._progress),
            "privileged": "Turn: " + ", ".join(self._code[self._progress:]),
            "expert_plan": [f"turn {c}" for c in self._code[self._progress:]],
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        offset = 0 if self.split == "train" else 10_000
        rng = random.Random((seed or 0) + offset)
        self._code = [rng.choice(COLOURS) for _ in range(self.length)]
        self._progress = 0
        return "A lock with six coloured dials. A note lies beside it.", self._info(True)

    def step(self, action):
        action = " ".join(str(action).lower().split())
        valid = action in self._info(True)["admissible_actions"]
        reward = 0.0
        if action == "read note":
            obs = "The note says: " + ", then ".join(self._code) + "."
        elif valid and action == f"turn {self._code[self._progress]}":
            self._progress += 1
            reward = 1.0 / self.length
            obs = "Click. The dial locks into place." + (" The lock opens!" if self._progress == self.length else "")
        elif valid:
            self._progress = 0
            obs = "Clunk. All dials spin back to the start."
        else:
            obs = "You can't do that with a lock."
        done = self._progress == self.length
        return obs, reward, done, False, self._info(valid)
