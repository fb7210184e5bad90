"""Collect trajectories from Python instead of the CLI, then read them back.

    python examples/collect_trajectories.py --episodes 4 --out /tmp/coin.jsonl

Uses the tiny default model (built on first use) on TextWorld Coin Collector.
"""

from __future__ import annotations

import argparse

from agentkit.envs import ActionParser, make
from agentkit.rollout import Collector, EpisodeSpec, SamplingParams
from agentkit.rollout.hf_backend import HFBackend

from agentkit.core.jsonl import TrajectoryWriter, read_trajectories
from agentkit.models import ensure_default_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--max-turns", type=int, default=5)
    parser.add_argument("--model", default=None)
    parser.add_argument("--out", default="coin.jsonl")
    args = parser.parse_args()

    backend = HFBackend(args.model or ensure_default_model(), seed=0)
    action_parser = ActionParser()
    collector = Collector(
        backend,
        lambda: make("textworld/coin-v0", max_turns=args.max_turns, action_parser=action_parser, level=2),
        env_id="textworld/coin-v0",
        sampling=SamplingParams(temperature=1.0, max_new_tokens=24),
    )
    specs = [EpisodeSpec(seed=task, sample=s) for task in range(args.episodes) for s in range(args.group_size)]
    with TrajectoryWriter(args.out, mode="overwrite") as writer:
        stats = collector.run(specs, writer.write)
    collector.close()
    print(f"{stats.episodes} episodes, success {stats.success_rate:.0%}, {stats.tokens_per_s:.0f} tokens/s")
    for traj in read_trajectories(args.out):
        print(traj.id, "won" if traj.won else "lost", [turn.action for turn in traj.turns])


if __name__ == "__main__":
    main()
