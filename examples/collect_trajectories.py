"""Collect trajectories from Python instead of the CLI, then read them back.

    python examples/collect_trajectories.py --episodes 4 --out /tmp/coin.jsonl

Uses the tiny default model (shipped with agentkit) on TextWorld Coin Collector, built from the
same settings models as ``agentkit rollout`` (``agentkit.core.settings``), so the environment's own
defaults (its level, action format and system prompt) apply as they do there.
"""

from __future__ import annotations

import argparse

from agentkit.core.jsonl import TrajectoryWriter, read_trajectories
from agentkit.core.settings import ContextSettings, EnvSettings, SamplingSettings
from agentkit.models import ensure_default_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--max-turns", type=int, default=5)
    parser.add_argument("--model", default=None)
    parser.add_argument("--out", default="coin.jsonl")
    args = parser.parse_args()

    from agentkit.rollout import EpisodeSpec
    from agentkit.rollout.hf_backend import HFBackend
    from agentkit.rollout.run import make_collector, make_envs, resolve_env, sampling_params

    env = resolve_env(EnvSettings(id="textworld/coin-v0", max_turns=args.max_turns))
    backend = HFBackend(args.model or ensure_default_model(), seed=0)
    collector = make_collector(backend, make_envs(env, "train"), env=env, split="train",
                               sampling=sampling_params(SamplingSettings(temperature=1.0, max_new_tokens=24), seed=0),
                               context=ContextSettings())
    specs = [EpisodeSpec(seed=task, sample=s) for task in range(args.episodes) for s in range(args.group_size)]
    try:
        with TrajectoryWriter(args.out, mode="overwrite") as writer:
            stats = collector.run(specs, writer.write)
    finally:
        collector.close()
        backend.close()
    print(f"{stats.episodes} episodes, success {stats.success_rate:.0%}, {stats.tokens_per_s:.0f} tokens/s")
    for traj in read_trajectories(args.out):
        print(traj.id, "won" if traj.won else "lost", [turn.action for turn in traj.turns])


if __name__ == "__main__":
    main()
