"""Environment workers as Ray actors: ``agentkit rollout --ray auto`` spreads environments over a cluster.

``RayEnvs`` is ``WorkerPool`` (rollout/workers.py) with Ray actors in place of local processes,
behind the same ``EnvRunner`` interface, so the same ``Collector`` drives it: slot s lives on actor
s % num_actors, each actor answers its requests in the order they were sent, and an actor that dies
or hangs past its timeout is killed and replaced, every episode that lived on it ending with the
error recorded while the run goes on.

Deliberate choices:

- No Ray ``runtime_env``: actors run in the Python each node was started with (``ray start``),
  importing agentkit and the environment from there. On a multi-node cluster agentkit and the
  environment's extras (``pip install 'agentkit[textworld]'``...) must be installed on every node,
  and actors see the environment variables of their node's ``ray start``, not the driver's (set
  ``AGENTKIT_CACHE``, ``ALFWORLD_DATA`` or ``JAVA_HOME`` there).
- Ray's own actor restarts and task retries are off: an environment's state dies with its process,
  so replacing the actor and ending its episodes is this runner's business, as with ``WorkerPool``.
- Each actor asks for one CPU, or an equal share of the cluster's CPUs when there are more actors
  than CPUs (a laptop's ``ray start --head --num-cpus 2`` runs ``--env-workers 4`` as four
  half-CPU actors); ``num_cpus`` pins the share, e.g. on an autoscaling cluster that should grow.
- Actors are spread over the nodes (Ray's "SPREAD" strategy) and live only as long as the driver.
- The Ray connection outlives ``close()`` (a training loop builds runners again and again); Ray
  shuts it down when the process exits.
"""

from __future__ import annotations

import logging
import math
import os
import re
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from agentkit.envs.protocol import Env
from agentkit.rollout.workers import (
    RESET_TIMEOUT_S,
    STEP_TIMEOUT_S,
    EnvResult,
    Op,
    ResetsAhead,
    close_all,
    serve,
)

from agentkit.core.errors import ConfigError, MissingDependencyError

ADDRESS_HELP = ("Start a cluster with `ray start --head` and pass the address it prints (or auto, to join the one "
                "running on this machine), or pass local to start one in this process.")
TOKEN_HELP = ("If the cluster uses token authentication (`ray start` turns it on when ~/.ray/auth_token exists), "
              "set RAY_AUTH_MODE=token here: Ray enables it by itself only for auto.")


def import_ray() -> ModuleType:
    try:
        import ray
    except ImportError as err:
        raise MissingDependencyError("Running environments on Ray (--ray) needs Ray: pip install 'agentkit[ray]'") from err
    return ray


def _check_reachable(address: str) -> None:
    """Fail in seconds on an address nothing listens at (``ray.init`` retries it for minutes)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"Ray address {address!r} (--ray): expected auto, local, HOST:PORT (e.g. 10.0.0.5:6379) "
                          f"or ray://HOST:PORT.")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as err:
        raise ConfigError(f"Ray address {address!r} (--ray): nothing answers at {host}:{port} ({err}). "
                          f"{ADDRESS_HELP}") from err


def connect(address: str) -> None:
    """Join the Ray cluster at ``address`` or start one here; a no-op when Ray is already initialized.

    ``address`` is "auto" (the cluster ``ray start`` runs on this machine, or ``RAY_ADDRESS``),
    "HOST:PORT" (a cluster's head node), "ray://HOST:PORT" (Ray Client) or "local" (a new cluster
    in this process, with this machine's CPUs).
    """
    ray = import_ray()
    if ray.is_initialized():
        return
    if address not in ("auto", "local"):
        _check_reachable(address)
    try:
        ray.init(address=address, logging_level=logging.WARNING,
                 **({"include_dashboard": False} if address == "local" else {}))
    except (ConnectionError, RuntimeError, ValueError) as err:
        hint = ADDRESS_HELP if address in ("auto", "local") else TOKEN_HELP
        raise ConfigError(f"Ray address {address!r} (--ray): could not connect: {str(err).rstrip('.')}. {hint}") from err


class _EnvActor:
    """One Ray actor: environments keyed by slot, built on first use, one request at a time."""

    def __init__(self, make_env: Callable[[], Env]) -> None:
        self.make_env = make_env
        self.envs: dict[int, Env] = {}

    def pid(self) -> int:
        return os.getpid()

    def run(self, slot: int, op: Op, arg: Any) -> tuple[tuple | None, str | None, float]:
        return serve(self.envs, self.make_env, slot, op, arg, host="Ray actor")

    def close(self) -> None:
        close_all(self.envs)


@dataclass
class _Request:
    ref: Any  # the ray.ObjectRef of the actor's answer
    slot: int
    op: Op
    started: float  # when the actor began on it (or when it was queued behind nothing)


@dataclass
class _Actor:
    handle: Any  # ray.actor.ActorHandle
    pid_ref: Any  # its first call, answered as soon as it is up
    queue: deque[_Request]
    up: bool = False  # answered pid_ref: until then no request's time counts (a replacement is starting)


def _death(err: Exception) -> str:
    """The cause in a Ray actor error, in a few words ("its worker process has died")."""
    for line in str(err).splitlines():
        if line.startswith("The actor is dead because "):
            return line.removeprefix("The actor is dead because ").split(". ")[0].rstrip(".")
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def _last_exception(err: Exception) -> str:
    """The innermost "SomeError: message" line of a Ray error (they embed the remote traceback)."""
    lines = [line.strip() for line in str(err).splitlines()]
    raised = [line for line in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b.*: ", line)]
    return raised[-1] if raised else lines[0] if lines else type(err).__name__


class RayEnvs(ResetsAhead):
    """Environments in ``num_actors`` Ray actors; slot s lives on actor s % num_actors.

    Args:
        make_env: a picklable callable building one environment (e.g. ``functools.partial(make,
            "textworld/coin-v0", max_turns=10)``); the actors unpickle it, so what it refers to
            must be importable on every node.
        num_actors: Ray actors (``--env-workers``).
        address: the cluster (see ``connect``); ignored when Ray is already initialized here.
        step_timeout_s: a step taking longer counts as a hang: the actor is killed and replaced.
        reset_timeout_s: the same for reset (longer: first resets may generate games or start a JVM).
        num_cpus: CPUs each actor reserves; None = 1, or an equal share when the cluster has fewer
            CPUs than actors.
        start_timeout_s: how long the actors may take to be scheduled and start.
    """

    def __init__(self, make_env: Callable[[], Env], num_actors: int = 2, *, address: str = "auto",
                 step_timeout_s: float = STEP_TIMEOUT_S, reset_timeout_s: float = RESET_TIMEOUT_S, num_cpus: float | None = None,
                 start_timeout_s: float = 120.0) -> None:
        if num_actors <= 0:
            raise ValueError(f"num_actors must be positive, got {num_actors}")
        super().__init__()
        connect(address)
        self._ray = ray = import_ray()
        self.make_env = make_env
        self.num_actors = num_actors
        self.step_timeout_s = step_timeout_s
        self.reset_timeout_s = reset_timeout_s
        cluster_cpus = ray.cluster_resources().get("CPU", 0.0)
        if num_cpus is None:
            if cluster_cpus <= 0:
                raise ConfigError("The Ray cluster has no CPUs to run environment actors on; start its nodes with "
                                  "`ray start --num-cpus N` (N > 0).")
            num_cpus = min(1.0, math.floor(cluster_cpus / num_actors * 1e4) / 1e4)
        self.num_cpus = num_cpus
        self._actor_class = ray.remote(_EnvActor).options(
            num_cpus=num_cpus, max_restarts=0, max_task_retries=0, scheduling_strategy="SPREAD")
        self._actors = [self._start() for _ in range(num_actors)]
        self._done: deque[EnvResult] = deque()
        self.restarts = 0
        self.start_timeout_s = start_timeout_s
        self._wait_started(start_timeout_s, cluster_cpus)
        for actor in self._actors:
            actor.up = True

    def _start(self) -> _Actor:
        handle = self._actor_class.remote(self.make_env)
        return _Actor(handle, handle.pid.remote(), deque())

    def _wait_started(self, timeout_s: float, cluster_cpus: float) -> None:
        """Fail now, with the reason, if the actors cannot be placed or cannot unpickle ``make_env``."""
        ray = self._ray
        refs = [actor.pid_ref for actor in self._actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        try:
            if len(ready) < len(refs):
                raise ConfigError(
                    f"{len(refs) - len(ready)} of {self.num_actors} environment actors ({self.num_cpus:g} CPU each) were "
                    f"not started within {timeout_s:.0f} s; the cluster has {cluster_cpus:g} CPUs and "
                    f"{ray.available_resources().get('CPU', 0.0):g} free. Lower --env-workers or free the cluster.")
            try:
                ray.get(refs)
            except ray.exceptions.RayActorError as err:
                raise ConfigError(f"An environment actor failed to start ({_last_exception(err)}). Is agentkit, with "
                                  "the environment's extras, installed in the Python of every Ray node?") from err
        except ConfigError:
            for actor in self._actors:
                self._ray.kill(actor.handle, no_restart=True)
            raise

    # -- the EnvRunner interface ----------------------------------------------------------------
    def _submit(self, slot: int, op: Op, arg: Any) -> None:
        actor = self._actors[slot % self.num_actors]
        actor.queue.append(_Request(actor.handle.run.remote(slot, op, arg), slot, op, time.perf_counter()))

    def _poll(self, timeout: float | None) -> list[EnvResult]:
        deadline = None if timeout is None else time.perf_counter() + timeout
        while True:
            self._receive()
            until_hang = self._check_deadlines()
            if self._done or until_hang is None:  # something to return, or nothing queued anywhere
                break
            wait_s = until_hang if deadline is None else min(until_hang, deadline - time.perf_counter())
            if wait_s <= 0:
                break
            refs = [request.ref for actor in self._actors for request in actor.queue]
            self._ray.wait(refs, num_returns=1, timeout=min(wait_s, 1.0))
        done = list(self._done)
        self._done.clear()
        return done

    @property
    def pending(self) -> int:
        return sum(len(actor.queue) for actor in self._actors)

    def pids(self) -> list[int]:
        """Each actor's process id (on its node)."""
        return self._ray.get([actor.pid_ref for actor in self._actors])

    def _close(self) -> None:
        ray = self._ray
        idle = [actor for actor in self._actors if not actor.queue]  # a busy one may be hung: just kill it
        ray.wait([actor.handle.close.remote() for actor in idle], num_returns=len(idle), timeout=10)
        for actor in self._actors:
            ray.kill(actor.handle, no_restart=True)

    # -- bookkeeping ------------------------------------------------------------------------------
    def _timeout(self, op: Op) -> float:
        return self.reset_timeout_s if op == "reset" else self.step_timeout_s

    def _restart(self, index: int, why: str) -> None:
        """Kill actor ``index``, fail everything queued on it, start a fresh one."""
        actor = self._actors[index]
        self._ray.kill(actor.handle, no_restart=True)
        for request in actor.queue:
            self._done.append(EnvResult(request.slot, request.op, None, f"{request.op} failed: {why}", 0.0))
        self._actors[index] = self._start()
        self.restarts += 1

    def _receive(self) -> None:
        """Move every answer that has arrived, in each actor's order, to ``_done``."""
        ray = self._ray
        refs = [request.ref for actor in self._actors for request in actor.queue]
        if not refs:
            return
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
        for index, actor in enumerate(self._actors):
            while actor.queue and actor.queue[0].ref in ready:
                request = actor.queue[0]
                try:
                    value, error, elapsed = ray.get(request.ref)
                except ray.exceptions.RayActorError as err:
                    self._restart(index, f"its Ray actor died ({_death(err)})")
                    break
                except ray.exceptions.RayError as err:  # e.g. the answer could not be pickled
                    value, error, elapsed = None, f"{request.op} failed: {type(err).__name__}: {err}", 0.0
                actor.queue.popleft()
                self._done.append(EnvResult(request.slot, request.op, value, error, elapsed))
                if actor.queue:
                    actor.queue[0].started = time.perf_counter()

    def _check_deadlines(self) -> float | None:
        """Restart hung actors; return seconds until the nearest deadline (None if nothing queued)."""
        now, nearest = time.perf_counter(), None
        for index, actor in enumerate(self._actors):
            if not actor.queue:
                continue
            head = actor.queue[0]
            if not actor.up:  # a request's time counts from when its actor is up, not while Ray starts it
                actor.up = bool(self._ray.wait([actor.pid_ref], timeout=0)[0])
                if actor.up:
                    head.started = now
                elif now - head.started > self.start_timeout_s:
                    self._restart(index, f"its Ray actor did not start within {self.start_timeout_s:.0f} s")
                    continue
                else:
                    nearest = 1.0 if nearest is None else min(nearest, 1.0)  # look again in a second
                    continue
            left = head.started + self._timeout(head.op) - now
            if left <= 0:
                self._restart(index, f"the environment did not answer within {self._timeout(head.op):.0f} s")
                continue
            nearest = left if nearest is None else min(nearest, left)
        return nearest
