"""Which environment runner a rollout gets: Ray actors (rollout/ray_workers.py), worker processes or
this process (rollout/workers.py). Above both, so that neither imports the other back."""

from __future__ import annotations

from collections.abc import Callable

from agentkit.envs.protocol import Env
from agentkit.rollout.workers import RESET_TIMEOUT_S, STEP_TIMEOUT_S, EnvRunner, InProcessEnvs, WorkerPool


def make_env_runner(make_env: Callable[[], Env], workers: int, *, ray: str | None = None, step_timeout_s: float = STEP_TIMEOUT_S,
                    reset_timeout_s: float = RESET_TIMEOUT_S) -> EnvRunner:
    """The environment runner a rollout asked for: Ray actors, worker processes, or this process.

    Args:
        make_env: a picklable callable building one environment (see ``WorkerPool``).
        workers: worker processes, or Ray actors with ``ray``; 0 steps environments in this process.
        ray: a Ray cluster to run the workers on (``auto``, ``host:port``, ``ray://host:port`` or
            ``local``; see ``agentkit.rollout.ray_workers.RayEnvs``); None = local processes.
        step_timeout_s: a step taking longer counts as a hang; its worker is restarted.
        reset_timeout_s: the same for reset (``env.reset_timeout``).
    """
    if ray is not None:
        from agentkit.rollout.ray_workers import RayEnvs

        return RayEnvs(make_env, workers, address=ray, step_timeout_s=step_timeout_s, reset_timeout_s=reset_timeout_s)
    if workers > 0:
        return WorkerPool(make_env, workers, step_timeout_s=step_timeout_s, reset_timeout_s=reset_timeout_s)
    return InProcessEnvs(make_env)
