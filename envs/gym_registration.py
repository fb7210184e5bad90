"""Gymnasium's side of the registry, above it: what ``gymnasium.make("agentkit/...")`` builds
(``make_for_gymnasium``, the entry point ``register_in_gymnasium`` names) and ``register_gymnasium()``,
which registers every agentkit id, entry-point plugins too. The registry registers each id it adds
through ``agentkit.envs.gym.register_in_gymnasium``, below it; the two ways are told in envs/gym.py."""

from __future__ import annotations

from typing import Any

import gymnasium
from agentkit.envs.gym import GYMNASIUM_PREFIX, AsGymnasium, TextEnv, register_in_gymnasium
from agentkit.envs.registry import REGISTRY, env_info, make


def make_for_gymnasium(agentkit_id: str, **kwargs: Any) -> gymnasium.Env[str, str]:
    """What ``gymnasium.make("agentkit/...")`` builds: the environment itself, bare commands in, seeds
    wrapped (``TextEnv.wrap_seeds``); ``AsGymnasium`` around one that is not a ``gymnasium.Env``."""
    env = make(agentkit_id, clean=False, **kwargs)
    if isinstance(env, TextEnv):
        env.wrap_seeds = True
        return env
    if isinstance(env, gymnasium.Env):
        return env  # make has checked its spaces
    return AsGymnasium(env)


def register_gymnasium() -> list[str]:
    """Register every agentkit id with Gymnasium, entry-point plugins included (their modules are
    imported to read their turn limits), and return their Gymnasium ids. ``import agentkit.envs``
    registers the built-ins and ``register`` each id it adds; this adds the plugins too."""
    return [register_in_gymnasium(record.name, env_info(record.name)) for record in REGISTRY.specs()
            if not record.name.startswith(GYMNASIUM_PREFIX)]
