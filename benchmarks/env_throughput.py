"""Environment steps/s through the worker pool versus raw stepping in one process.

For each environment: K environment slots play episodes with a seeded random policy (a random
admissible action, or the expert's next action where there is no admissible list). "raw" steps
the K environments one after another in this process; "pool" runs them in W worker processes,
keeping every slot busy, for each W in ``--workers`` (1, 2, 4 by default). Resets count as work;
every side cycles through the same 16 tasks, generated before timing.

All sides are built once (worker processes started, first tasks loaded, outside the timing) and
then measured in alternating windows, ``--rounds`` of each, so that load from other jobs on a
shared machine falls on every side alike. steps/s = steps over the timed windows / their total
time; ratio = pool steps/s / raw steps/s. Requests still in flight when a pool's window closes are
drained untimed and not counted.

    python benchmarks/env_throughput.py --env textworld/simple-v0 --workers 1 2 4 --seconds 9
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import platform
import random
import time
from datetime import date

TASKS = 16  # every side cycles through the same tasks, loaded once before timing (games are cached)
DEFAULT_ENVS = ["textworld/simple-v0", "alfworld/alfworld-v0", "scienceworld/scienceworld-v0", "search-qa/generated-v0"]


def choose(info: dict, rng: random.Random) -> str:
    actions = info.get("admissible_actions")
    if actions:
        return rng.choice(actions)
    plan = info.get("expert_plan") or []
    return plan[0] if plan else "look"


class Raw:
    """K environments stepped one after another in this process."""

    def __init__(self, make_env, slots: int, seed: int) -> None:
        self.rng, self.tasks = random.Random(seed), itertools.cycle(range(TASKS))
        self.envs = [make_env() for _ in range(slots)]
        self.infos = [env.reset(seed=next(self.tasks))[1] for env in self.envs]

    def run(self, seconds: float) -> tuple[int, float]:
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for i, env in enumerate(self.envs):
                _, _, terminated, truncated, self.infos[i] = env.step(choose(self.infos[i], self.rng))
                steps += 1
                if terminated or truncated:
                    self.infos[i] = env.reset(seed=next(self.tasks))[1]
        return steps, time.perf_counter() - start

    def close(self) -> None:
        for env in self.envs:
            env.close()


class Pooled:
    """K environments in a WorkerPool of W processes, every slot kept busy during a window."""

    def __init__(self, make_env, slots: int, workers: int, seed: int) -> None:
        from agentkit.rollout.workers import WorkerPool

        self.rng, self.tasks = random.Random(seed), itertools.cycle(range(TASKS))
        self.pool = WorkerPool(make_env, workers, step_timeout_s=120)
        self.infos: dict[int, dict] = {}
        for slot in range(slots):
            self.pool.submit(slot, "reset", next(self.tasks))
        while len(self.infos) < slots:  # workers started and first tasks loaded, outside the timing
            for r in self._results():
                self.infos[r.slot] = r.value[1]

    def _results(self):
        results = self.pool.poll(None)
        for r in results:
            if r.error:
                raise RuntimeError(r.error)
        return results

    def run(self, seconds: float) -> tuple[int, float]:
        steps, start = 0, time.perf_counter()
        for slot in self.infos:
            self.pool.submit(slot, "step", choose(self.infos[slot], self.rng))
        while time.perf_counter() - start < seconds:
            for r in self._results():
                if r.op == "step":
                    steps += 1
                    _, _, terminated, truncated, self.infos[r.slot] = r.value
                    if terminated or truncated:
                        self.pool.submit(r.slot, "reset", next(self.tasks))
                        continue
                else:
                    self.infos[r.slot] = r.value[1]
                self.pool.submit(r.slot, "step", choose(self.infos[r.slot], self.rng))
        elapsed = time.perf_counter() - start
        while self.pool.pending:  # finish what is in flight, untimed, so the next window starts clean
            for r in self._results():
                if r.op == "reset":
                    self.infos[r.slot] = r.value[1]
                    continue
                _, _, terminated, truncated, self.infos[r.slot] = r.value
                if terminated or truncated:
                    self.pool.submit(r.slot, "reset", next(self.tasks))
        return steps, elapsed

    def close(self) -> None:
        self.pool.close()


def measure(env_id: str, slots: int, workers: list[int], seconds: float, rounds: int, max_turns: int, seed: int) -> dict:
    from agentkit.envs import make

    make_env = functools.partial(make, env_id, max_turns=max_turns)
    warm = make_env()  # generate or load every task once, so no side pays for it
    for task in range(TASKS):
        warm.reset(seed=task)
    warm.close()
    sides = {"raw": Raw(make_env, slots, seed)}
    try:
        for w in workers:
            sides[f"pool{w}"] = Pooled(make_env, slots, w, seed)
        totals = {name: [0, 0.0] for name in sides}
        for _ in range(rounds):
            for name, side in sides.items():
                steps, elapsed = side.run(seconds / rounds)
                totals[name][0] += steps
                totals[name][1] += elapsed
    finally:
        for side in sides.values():
            side.close()
    raw_sps = totals["raw"][0] / totals["raw"][1]
    row = {"env": env_id, "slots": slots, "rounds": rounds, "raw_steps_per_s": round(raw_sps, 1)}
    for w in workers:
        sps = totals[f"pool{w}"][0] / totals[f"pool{w}"][1]
        row[f"pool{w}_steps_per_s"] = round(sps, 1)
        row[f"pool{w}_ratio"] = round(sps / raw_sps, 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", action="append", help=f"Environment id (repeatable). Default: {', '.join(DEFAULT_ENVS)}.")
    parser.add_argument("--slots", type=int, default=4, help="Environments played at once.")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4], help="Worker-process counts to measure.")
    parser.add_argument("--seconds", type=float, default=9.0, help="Measured time per side (raw, each pool size).")
    parser.add_argument("--rounds", type=int, default=3, help="Alternating windows per side the seconds are split into.")
    parser.add_argument("--max-turns", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="Append the results as JSON lines to this file.")
    args = parser.parse_args()
    if any(w <= 0 for w in args.workers):
        parser.error(f"--workers takes positive counts, got {args.workers}")

    for env_id in args.env or DEFAULT_ENVS:
        row = measure(env_id, args.slots, args.workers, args.seconds, args.rounds, args.max_turns, args.seed)
        row.update(machine=f"{platform.machine()}, {os.cpu_count()} cores", date=str(date.today()))
        print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
