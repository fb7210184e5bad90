"""``check_env``: validate any environment against the contract of ``agentkit.envs.protocol``."""

from __future__ import annotations

import math
from typing import Any

from agentkit.envs.protocol import INFO_KEYS, Env

from agentkit.core.errors import EnvError


def _check_info(info: Any, where: str) -> None:
    if not isinstance(info, dict):
        raise EnvError(f"{where}: info must be a dict, got {type(info).__name__}.")
    missing = [k for k in INFO_KEYS if k not in info]
    if missing:
        raise EnvError(f"{where}: info lacks the required key(s) {missing}; every info carries {list(INFO_KEYS)}. "
                       "Add them, or, for a Gymnasium environment, play it as gymnasium/<its Gymnasium id> or wrap it "
                       "in agentkit.envs.FromGymnasium, which fill in defaults.")
    if not isinstance(info["task"], str):
        raise EnvError(f"{where}: info['task'] must be a str, got {type(info['task']).__name__}.")
    adm = info["admissible_actions"]
    if adm is not None and not (isinstance(adm, list) and all(isinstance(a, str) for a in adm)):
        raise EnvError(f"{where}: info['admissible_actions'] must be a list of str or None.")
    for key in ("action_valid", "won"):
        if not isinstance(info[key], bool):
            raise EnvError(f"{where}: info[{key!r}] must be a bool, got {type(info[key]).__name__}.")
    score = info["score"]
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        raise EnvError(f"{where}: info['score'] must be a finite number, got {score!r}.")
    if info["privileged"] is not None and not isinstance(info["privileged"], str):
        raise EnvError(f"{where}: info['privileged'] must be a str or None.")


def check_env(env: Env, *, seed: int = 0, max_steps: int = 8, invalid_action: str = "xyzzy plugh") -> None:
    """Raise ``EnvError`` naming the first broken rule of the contract.

    Checks: reset returns (str, info) with every info key; reset with the same seed gives the same
    observation and task; step returns a 5-tuple with a str observation, a finite float reward
    and bool flags; an obviously invalid action is flagged ``action_valid=False`` (when the
    environment lists admissible actions) and does not raise; admissible actions step cleanly.
    """
    for method in ("reset", "step", "close"):
        if not callable(getattr(env, method, None)):
            raise EnvError(f"{type(env).__name__} has no {method}() method.")
    result = env.reset(seed=seed)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise EnvError(f"reset() must return (observation, info), got {type(result).__name__}.")
    obs, info = result
    if not isinstance(obs, str):
        raise EnvError(f"reset(): observation must be a str, got {type(obs).__name__}.")
    _check_info(info, "reset()")
    obs2, info2 = env.reset(seed=seed)
    if obs2 != obs or info2["task"] != info["task"]:
        raise EnvError(f"reset(seed={seed}) is not deterministic: two resets gave different observations or tasks.")

    def _step(action: str, where: str) -> tuple[str, float, bool, bool, dict]:
        out = env.step(action)
        if not (isinstance(out, tuple) and len(out) == 5):
            raise EnvError(f"{where}: step() must return (observation, reward, terminated, truncated, info).")
        o, r, term, trunc, inf = out
        if not isinstance(o, str):
            raise EnvError(f"{where}: observation must be a str, got {type(o).__name__}.")
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r):
            raise EnvError(f"{where}: reward must be a finite number, got {r!r}.")
        if not isinstance(term, bool) or not isinstance(trunc, bool):
            raise EnvError(f"{where}: terminated and truncated must be bool, got {term!r}, {trunc!r}.")
        _check_info(inf, where)
        return o, float(r), term, trunc, inf

    _, reward, terminated, truncated, info = _step(invalid_action, f"step({invalid_action!r})")
    if info["admissible_actions"] is not None and info["action_valid"]:
        raise EnvError(f"step({invalid_action!r}): an action outside the admissible list must give action_valid=False.")
    if terminated or truncated:
        return
    for i in range(max_steps):
        adm = info["admissible_actions"]
        if not adm:
            break
        action = adm[i % len(adm)]
        _, reward, terminated, truncated, info = _step(action, f"step({action!r})")
        if not info["action_valid"]:
            raise EnvError(f"step({action!r}): an admissible action came back with action_valid=False.")
        if terminated or truncated:
            break


def play_expert(env: Env, seed: int, *, max_steps: int = 200) -> tuple[bool, int]:
    """Play ``info['expert_plan']`` from reset (re-reading it after each step, since planners
    recompute it) and return (won, steps). Raises ``EnvError`` if the environment has no plan."""
    _, info = env.reset(seed=seed)
    if "expert_plan" not in info:
        raise EnvError("this environment gives no info['expert_plan'], so its expert cannot be played.")
    steps = 0
    while steps < max_steps:
        plan = info.get("expert_plan") or []
        if not plan:
            break
        _, _, terminated, truncated, info = env.step(plan[0])
        steps += 1
        if terminated or truncated:
            break
    return bool(info["won"]), steps
