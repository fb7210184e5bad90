"""Environments behind an asynchronous interface: in-process, or in worker processes.

The collector submits resets and steps and polls for results, so it can generate for the
episodes that are ready while others' environments are still stepping. ``WorkerPool`` runs the
environments in separate processes (slow simulators like ScienceWorld's JVM or ALFWorld's planner
then overlap with generation and with each other); a worker that dies or hangs past its timeout
is killed and restarted, and every episode that lived on it ends with the error recorded; and the
workers die with the process that started them, even one killed with ``kill -9``.
``InProcessEnvs`` steps environments synchronously in the caller's process (tests, plugins
registered at run time, and environments too cheap to be worth a process). ``RayEnvs``
(rollout/ray_workers.py) runs them as Ray actors across a cluster, with the same failure handling;
``make_env_runner`` (rollout/runners.py, above both) builds whichever a rollout asked for.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Literal, Protocol, runtime_checkable

from agentkit.envs.protocol import Env

from agentkit.core.settings import EnvSettings, default

STEP_TIMEOUT_S: float = default(EnvSettings, "step_timeout")  # a step taking longer counts as a hang
RESET_TIMEOUT_S: float = default(EnvSettings, "reset_timeout")  # the same for a reset

Op = Literal["reset", "step"]


@dataclass(frozen=True)
class EnvResult:
    """The outcome of one submitted reset or step.

    Attributes:
        slot: the environment slot the request was for.
        op: "reset" or "step".
        value: reset's (obs, info) or step's (obs, reward, terminated, truncated, info); None on error.
        error: what went wrong (the environment raised, its worker died or hung), else None.
        elapsed_s: seconds the environment spent on it.
    """

    slot: int
    op: Op
    value: tuple | None
    error: str | None
    elapsed_s: float


@runtime_checkable
class EnvRunner(Protocol):
    """Asynchronous access to a set of environment slots (one episode at a time per slot)."""

    def submit(self, slot: int, op: Op, arg: Any) -> None:
        """Queue ``reset(seed=arg)`` or ``step(arg)`` for the environment in ``slot``."""
        ...

    def poll(self, timeout: float | None) -> list[EnvResult]:
        """Results that are ready; wait up to ``timeout`` seconds (None: until one is) for the first."""
        ...

    def reset_ahead(self, slot: int, seed: Any) -> None:
        """Start ``reset(seed=seed)`` in ``slot`` before it is asked for; a later ``submit(slot,
        "reset", seed)`` takes its result instead of resetting again (``ResetsAhead``)."""
        ...

    def close(self) -> None: ...


class ResetsAhead:
    """Resets started before they are asked for, in runners whose environments live in other
    processes (worker processes, Ray actors).

    A training loop calls ``reset_ahead`` with the next step's first episodes before its update, so
    those resets run in the workers while it trains instead of at the start of the next step.
    Nothing but *when* a reset runs changes: ``submit(slot, "reset", seed)`` with the early reset's
    seed gets that result (its ``elapsed_s`` as measured then, error included); any other request
    for the slot queues behind the early reset, whose result is dropped.

    A runner implements ``_submit(slot, op, arg)`` (sends the request, does not wait), ``_poll(timeout)``
    and ``_close()``, and calls ``super().__init__()``.
    """

    def __init__(self) -> None:
        self._ahead = _AheadState()

    def reset_ahead(self, slot: int, seed: Any) -> None:
        state = self._ahead
        if slot in state.started:  # one early reset per slot at a time
            return
        state.started[slot] = seed
        self._submit(slot, "reset", seed)

    def submit(self, slot: int, op: Op, arg: Any) -> None:
        state = self._ahead
        if slot in state.started:
            seed = state.started.pop(slot)
            if op == "reset" and arg == seed:  # taken: held, or still on its way (poll then passes it on)
                if slot in state.held:
                    state.ready.append(state.held.pop(slot))
                return
            if state.held.pop(slot, None) is None:
                state.dropped.add(slot)  # on its way: poll drops it
        self._submit(slot, op, arg)

    def poll(self, timeout: float | None) -> list[EnvResult]:
        state = self._ahead
        out, state.ready = state.ready, []
        for result in self._poll(0 if out else timeout):
            early = result.op == "reset"
            if early and result.slot in state.started:
                state.held[result.slot] = result  # not asked for yet
            elif early and result.slot in state.dropped:
                state.dropped.discard(result.slot)
            else:
                out.append(result)
        return out

    def close(self) -> None:
        self._close()


@dataclass
class _AheadState:
    started: dict[int, Any] = field(default_factory=dict)  # slot -> seed, not asked for yet
    held: dict[int, EnvResult] = field(default_factory=dict)  # results of early resets not asked for yet
    dropped: set[int] = field(default_factory=set)  # early resets whose result is to be dropped
    ready: list[EnvResult] = field(default_factory=list)  # asked-for results to hand out at the next poll


def _run(env: Env, op: Op, arg: Any) -> tuple:
    if op == "reset":
        return env.reset(seed=arg)
    return env.step(arg)


class InProcessEnvs:
    """Environments stepped synchronously in this process; results are ready at once."""

    def __init__(self, make_env: Callable[[], Env]) -> None:
        self.make_env = make_env
        self._envs: dict[int, Env] = {}
        self._done: deque[EnvResult] = deque()

    def reset_ahead(self, slot: int, seed: Any) -> None:
        """Nothing: here a reset runs when it is asked for. Run early, in a thread, it competes with
        the training step for the interpreter (measured in benchmarks/RESULTS.md, "Resets ahead":
        the multi-turn TextWorld peer's 8-turn step 1.67 s -> 2.14 s on 2 cores); worker processes
        reset ahead."""

    def submit(self, slot: int, op: Op, arg: Any) -> None:
        start = time.perf_counter()
        try:
            env = self._envs.get(slot)
            if env is None:
                env = self._envs[slot] = self.make_env()
            value, error = _run(env, op, arg), None
        except Exception as err:  # noqa: BLE001 - a broken env ends its episode, not the run
            value, error = None, f"{op} failed: {type(err).__name__}: {err}"
            self._discard(slot)  # its state is unknown: the next reset builds a fresh one
        self._done.append(EnvResult(slot, op, value, error, time.perf_counter() - start))

    def poll(self, timeout: float | None) -> list[EnvResult]:
        done = list(self._done)
        self._done.clear()
        return done

    def _discard(self, slot: int) -> None:
        env = self._envs.pop(slot, None)
        if env is not None:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - closing a broken env may fail too
                pass

    def close(self) -> None:
        for slot in list(self._envs):
            self._discard(slot)


def serve(envs: dict[int, Env], make_env: Callable[[], Env], slot: int, op: Op, arg: Any, *,
          host: str) -> tuple[tuple | None, str | None, float]:
    """One request on a worker that keeps its environments in ``envs`` by slot (built on first use).

    Returns (value, error, elapsed_s). A step on a slot with no environment means the worker was
    restarted under the episode (``host`` names it: "worker process", "Ray actor"); an environment
    that raises is closed and dropped, so the next reset builds a fresh one.
    """
    start = time.perf_counter()
    env = envs.get(slot)
    if env is None and op == "step":
        return None, f"step failed: its {host} died and was restarted, so this environment was lost", 0.0
    try:
        if env is None:
            env = envs[slot] = make_env()
        return _run(env, op, arg), None, time.perf_counter() - start
    except Exception as err:  # noqa: BLE001 - reported to the caller, which ends the episode
        error = f"{op} failed: {type(err).__name__}: {err}\n" + traceback.format_exc(limit=3)
        broken = envs.pop(slot, None)
        if broken is not None:
            try:
                broken.close()
            except Exception:  # noqa: BLE001
                pass
        return None, error, time.perf_counter() - start


def close_all(envs: dict[int, Env]) -> None:
    for env in envs.values():
        try:
            env.close()
        except Exception:  # noqa: BLE001 - closing a broken env may fail too
            pass
    envs.clear()


PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
PARENT_POLL_S = 0.5  # how often a worker's watchdog looks for its parent


def _children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux: read from /proc; elsewhere none are found)."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            found.append(int(entry))
    return found


def _watch_parent(parent_pid: int) -> None:
    """Once the parent is gone (this process was re-parented), kill this worker's own children
    (an environment's simulator) and exit at once: nobody is left to read an answer."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    for child in _children_of(os.getpid()):
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGKILL)
    os._exit(1)


def die_with_parent(parent_pid: int, parent_death_signal: bool) -> None:
    """Make this worker end when the process that started it ends, ``kill -9`` included (which
    runs none of the parent's cleanup, so ``close`` never comes).

    On Linux the kernel SIGKILLs the worker when its parent dies (``PR_SET_PDEATHSIG``), even while
    an environment hangs in C code holding the GIL. That signal follows the *thread* that started
    the worker, so the pool asks for it only when that thread is the main thread (which lives as
    long as the process); a pool built from another thread, and other platforms, rely on a
    watchdog thread that notices the worker was re-parented. Grandchildren: the watchdog kills
    the worker's children; ScienceWorld's JVM (py4j ``die_on_exit``) exits by itself once the
    worker's end of its stdin pipe closes, however the worker died.
    """
    if parent_death_signal and sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # on failure the watchdog still runs
    if os.getppid() != parent_pid:  # the parent died while this process was starting
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="agentkit-parent-watchdog", daemon=True).start()


def _worker_main(conn: Connection, make_env: Callable[[], Env], stop=None, parent_pid: int | None = None,
                 parent_death_signal: bool = False) -> None:
    """A worker process: builds environments on first use of a slot, serves requests in order.

    Ctrl-C in a terminal sends SIGINT to the whole process group, workers included: they ignore
    it (from their start, see ``_sigint_ignored``) and leave stopping to the parent, which closes
    them, so an interrupted rollout prints the parent's one line and no worker tracebacks. A
    parent killed outright takes its workers with it (``die_with_parent``).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if parent_pid is not None:
        die_with_parent(parent_pid, parent_death_signal)
    envs: dict[int, Env] = {}
    try:  # started (its environment module imported): requests' time counts from now (this clock is the machine's)
        conn.send((None, None, "up", None, None, time.perf_counter()))
    except (BrokenPipeError, OSError):
        return
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            break
        if request is None or (stop is not None and stop.is_set()):  # closing: skip what is still queued
            break
        req_id, slot, op, arg = request
        value, error, elapsed = serve(envs, make_env, slot, op, arg, host="worker process")
        try:
            conn.send((req_id, slot, op, value, error, elapsed))
        except (BrokenPipeError, OSError):
            break
    close_all(envs)


@dataclass
class _Request:
    id: int
    slot: int
    op: Op
    started: float  # when the worker began on it (or when it was queued behind nothing, or the worker came up)


@contextlib.contextmanager
def _sigint_ignored():
    """Ignore SIGINT while a worker starts, so the new interpreter inherits the ignored disposition
    and a Ctrl-C while it is still importing its environment prints nothing either. (Python leaves
    an inherited SIG_IGN in place; only the main thread may change signal handlers.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)  # None: set outside Python


class _Worker:
    def __init__(self, ctx, make_env: Callable[[], Env], index: int) -> None:
        parent, child = ctx.Pipe(duplex=True)
        self.stop = ctx.Event()  # set on close: the worker stops after the request it is serving
        # spawn and fork make this process the worker's parent (forkserver would not: it has no watchdog then);
        # the kernel's parent-death signal follows the starting thread, so only the main thread asks for it
        direct = ctx.get_start_method() in ("spawn", "fork")
        self.process = ctx.Process(target=_worker_main, name=f"agentkit-env-{index}", daemon=True,
                                   args=(child, make_env, self.stop, os.getpid() if direct else None,
                                         threading.current_thread() is threading.main_thread()))
        with _sigint_ignored():
            self.process.start()
        child.close()
        self.conn = parent
        self.queue: deque[_Request] = deque()
        self.born = time.perf_counter()
        self.up = False  # until its first message: a fresh interpreter importing the environment's module

    def kill(self) -> None:
        try:
            self.conn.close()
        except OSError:
            pass
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)


class WorkerPool(ResetsAhead):
    """Environments in ``num_workers`` processes; slot s lives on worker s % num_workers.

    Args:
        make_env: a picklable callable building one environment (e.g. ``functools.partial(make,
            "textworld/coin-v0", max_turns=10)``); with the default "spawn" start method it must be
            importable by a fresh interpreter (entry-point or built-in ids, not ``register()``
            calls made at run time).
        num_workers: worker processes.
        step_timeout_s: a step taking longer counts as a hang: the worker is killed and restarted.
        reset_timeout_s: the same for reset (longer: first resets may generate games or start a JVM).
        start_method: multiprocessing start method ("spawn" is safe with torch threads).
        start_timeout_s: how long a worker process may take to start (a fresh interpreter importing the
            environment's module); a request's time counts from when its worker is up, so a restart on a
            busy machine is not taken for a hang. None: ``reset_timeout_s``.
    """

    def __init__(self, make_env: Callable[[], Env], num_workers: int, *, step_timeout_s: float = STEP_TIMEOUT_S,
                 reset_timeout_s: float = RESET_TIMEOUT_S, start_method: str = "spawn",
                 start_timeout_s: float | None = None) -> None:
        if num_workers <= 0:
            raise ValueError(f"num_workers must be positive, got {num_workers}")
        super().__init__()
        self.make_env = make_env
        self.num_workers = num_workers
        self.step_timeout_s = step_timeout_s
        self.reset_timeout_s = reset_timeout_s
        self.start_timeout_s = reset_timeout_s if start_timeout_s is None else start_timeout_s
        self._ctx = mp.get_context(start_method)
        self._workers = [_Worker(self._ctx, make_env, i) for i in range(num_workers)]
        self._ids = itertools.count()
        self._done: deque[EnvResult] = deque()
        self.restarts = 0

    def _submit(self, slot: int, op: Op, arg: Any) -> None:
        worker = self._workers[slot % self.num_workers]
        request = _Request(next(self._ids), slot, op, time.perf_counter())
        try:
            worker.conn.send((request.id, slot, op, arg))
        except (BrokenPipeError, OSError):
            worker.queue.append(request)
            self._restart(slot % self.num_workers, "its worker process died")
            return
        worker.queue.append(request)

    def _timeout(self, op: Op) -> float:
        return self.reset_timeout_s if op == "reset" else self.step_timeout_s

    def _restart(self, index: int, why: str) -> None:
        """Kill worker ``index``, fail everything queued on it, start a fresh one."""
        worker = self._workers[index]
        code = worker.process.exitcode
        worker.kill()
        detail = f"{why} (exit code {worker.process.exitcode if code is None else code})"
        for request in worker.queue:
            self._done.append(EnvResult(request.slot, request.op, None, f"{request.op} failed: {detail}", 0.0))
        self._workers[index] = _Worker(self._ctx, self.make_env, index)
        self.restarts += 1

    def _receive(self, index: int) -> None:
        worker = self._workers[index]
        try:
            while worker.conn.poll():
                req_id, slot, op, value, error, elapsed = worker.conn.recv()
                if req_id is None:  # "up": the worker has started; its first request's time begins then
                    worker.up = True
                    if worker.queue:
                        worker.queue[0].started = max(worker.queue[0].started, elapsed)
                    continue
                request = worker.queue.popleft()
                assert request.id == req_id, "worker answered out of order"
                self._done.append(EnvResult(slot, op, value, error, elapsed))
                if worker.queue:
                    worker.queue[0].started = time.perf_counter()
        except (EOFError, OSError, ConnectionResetError):
            self._restart(index, "its worker process died")

    def _check_deadlines(self) -> float | None:
        """Restart hung workers; return seconds until the nearest deadline (None if nothing queued)."""
        now, nearest = time.perf_counter(), None
        for index, worker in enumerate(self._workers):
            if not worker.queue:
                continue
            head = worker.queue[0]
            if worker.up:
                left = head.started + self._timeout(head.op) - now
            else:
                left = worker.born + self.start_timeout_s - now
            if left <= 0:
                self._restart(index, f"the environment did not answer within {self._timeout(head.op):.0f} s" if worker.up
                              else f"its worker process did not start within {self.start_timeout_s:.0f} s")
                continue
            if not worker.process.is_alive():
                self._receive(index)  # it may have answered before dying
                if self._workers[index] is worker and worker.queue:
                    self._restart(index, "its worker process died")
                continue
            nearest = left if nearest is None else min(nearest, left)
        return nearest

    def _poll(self, timeout: float | None) -> list[EnvResult]:
        deadline = None if timeout is None else time.perf_counter() + timeout
        while True:
            for index in range(self.num_workers):
                self._receive(index)
            until_hang = self._check_deadlines()
            if self._done:
                break
            if until_hang is None:  # nothing queued anywhere: nothing will arrive
                break
            wait_s = until_hang if deadline is None else min(until_hang, deadline - time.perf_counter())
            if wait_s <= 0:
                break
            busy = [w.conn for w in self._workers if w.queue]
            sentinels = [w.process.sentinel for w in self._workers if w.queue]
            wait(busy + sentinels, timeout=min(wait_s, 1.0))
        done = list(self._done)
        self._done.clear()
        return done

    @property
    def pending(self) -> int:
        return sum(len(w.queue) for w in self._workers)

    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    def _close(self, timeout_s: float = 10.0) -> None:
        """Stop the workers: each finishes the request it is serving (requests still queued are
        dropped, as after Ctrl-C) and closes its environments; any still running after
        ``timeout_s`` in all is killed."""
        for worker in self._workers:
            worker.stop.set()
            try:
                worker.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        deadline = time.monotonic() + timeout_s
        for worker in self._workers:
            worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
            worker.kill()
