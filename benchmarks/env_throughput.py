"""Environment steps/s through the worker pool versus raw stepping in one process.

For each environment: K environment slots play episodes with a seeded random policy (a random
admissible action, or the expert's next action where there is no admissible list). "raw" steps
the K environments one after another in this process; "pool" runs them in W worker processes,
keeping every slot busy, for W in 1, 2, 4. ratio = pool steps/s / raw steps/s, measured in one run.
Resets count as work; both sides cycle through the same 16 tasks, generated before timing.

    python benchmarks/env_throughput.py --env textworld/simple-v0 --seconds 10
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

TASKS = 16  # both sides cycle through the same tasks, loaded once before timing (games are cached)
DEFAULT_ENVS = ["textworld/simple-v0", "alfworld/alfworld-v0", "scienceworld/scienceworld-v0", "search-qa/generated-v0"]


def choose(info: dict, rng: random.Random) -> str:
    actions = info.get("admissible_actions")
    if actions:
        return rng.choice(actions)
    plan = info.get("expert_plan") or []
    return plan[0] if plan else "look"


def raw(make_env, slots: int, seconds: float, seed: int) -> float:
    rng = random.Random(seed)
    envs = [make_env() for _ in range(slots)]
    infos, tasks, steps = [], itertools.cycle(range(TASKS)), 0
    for env in envs:
        infos.append(env.reset(seed=next(tasks))[1])
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for i, env in enumerate(envs):
            _, _, terminated, truncated, infos[i] = env.step(choose(infos[i], rng))
            steps += 1
            if terminated or truncated:
                infos[i] = env.reset(seed=next(tasks))[1]
    elapsed = time.perf_counter() - start
    for env in envs:
        env.close()
    return steps / elapsed


def pooled(make_env, slots: int, workers: int, seconds: float, seed: int) -> float:
    from agentkit.rollout.workers import WorkerPool

    rng = random.Random(seed)
    pool = WorkerPool(make_env, workers, step_timeout_s=120)
    tasks, infos = itertools.cycle(range(TASKS)), {}
    try:
        for slot in range(slots):
            pool.submit(slot, "reset", next(tasks))
        while len(infos) < slots:  # workers started and first tasks loaded, outside the timing
            for r in pool.poll(None):
                infos[r.slot] = r.value[1]
        steps, start = 0, time.perf_counter()
        for slot in range(slots):
            pool.submit(slot, "step", choose(infos[slot], rng))
        while time.perf_counter() - start < seconds:
            for r in pool.poll(None):
                if r.error:
                    raise RuntimeError(r.error)
                if r.op == "step":
                    steps += 1
                    _, _, terminated, truncated, infos[r.slot] = r.value
                    if terminated or truncated:
                        pool.submit(r.slot, "reset", next(tasks))
                        continue
                else:
                    infos[r.slot] = r.value[1]
                pool.submit(r.slot, "step", choose(infos[r.slot], rng))
        elapsed = time.perf_counter() - start
    finally:
        pool.close()
    return steps / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", action="append", help=f"Environment id (repeatable). Default: {', '.join(DEFAULT_ENVS)}.")
    parser.add_argument("--slots", type=int, default=4, help="Environments played at once.")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seconds", type=float, default=10.0, help="Measured time per configuration.")
    parser.add_argument("--max-turns", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="Append the results as JSON lines to this file.")
    args = parser.parse_args()

    from agentkit.envs import make

    for env_id in args.env or DEFAULT_ENVS:
        make_env = functools.partial(make, env_id, max_turns=args.max_turns)
        warm = make_env()  # generate or load every task once, so neither side pays for it
        for task in range(TASKS):
            warm.reset(seed=task)
        warm.close()
        raw_sps = raw(make_env, args.slots, args.seconds, args.seed)
        row = {"env": env_id, "slots": args.slots, "raw_steps_per_s": round(raw_sps, 1)}
        for workers in args.workers:
            sps = pooled(make_env, args.slots, workers, args.seconds, args.seed)
            row[f"pool{workers}_steps_per_s"] = round(sps, 1)
            row[f"pool{workers}_ratio"] = round(sps / raw_sps, 2)
        row.update(machine=f"{platform.machine()}, {os.cpu_count()} cores", date=str(date.today()))
        print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
