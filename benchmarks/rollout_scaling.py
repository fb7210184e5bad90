"""How rollout wall time and trajectory file size grow with turns per episode and episodes in flight.

Two sweeps with the transformers backend, chat context and the tiny default model:

- turns per episode (``--turns``) at a fixed batch: in chat mode each turn tokenizes only the new
  observation (never the history), so the collector's own time per turn and the bytes written per
  turn should stay flat; generate time per turn grows with the context, since each turn's prompt
  (the whole conversation) is prefilled again;
- episodes in flight (``--batch``) at a fixed number of turns: one batched generate per turn, so
  time per episode should fall while bytes per episode stay flat.

The untrained model's whole response is sent to the environment as the command
(``ActionParser(require_match=False)``) and the turn limit caps every episode, so episodes last
exactly ``turns`` turns. Responses have a fixed length (no stop strings). The columns split each
run into generate, environment (reset + step), tokenization and the rest (bookkeeping + writing).

    python benchmarks/rollout_scaling.py --turns 2 4 8 16 --batch 1 4 16 64
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import tempfile
import time
from pathlib import Path

from agentkit.core.settings import ContextSettings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def run(backend, env_id: str, batch: int, turns: int, max_new_tokens: int, seed: int) -> dict:
    from agentkit.envs import ActionParser, make
    from agentkit.rollout import Collector, EpisodeSpec, SamplingParams
    from agentkit.rollout.workers import InProcessEnvs

    from agentkit.core.jsonl import TrajectoryWriter

    params = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, stop=(), seed=seed)
    make_env = functools.partial(make, env_id, max_turns=turns, action_parser=ActionParser(require_match=False))
    warm = make_env()  # build the games outside the timed region
    for task in range(batch):
        warm.reset(seed=seed + task)
    warm.close()
    collector = Collector(backend, InProcessEnvs(make_env), env_id=env_id, sampling=params, context=ContextSettings(mode="chat"))
    tokenize_start = backend.tokenizer.seconds
    final_context: list[int] = []

    def write(trajectory) -> None:
        writer.write(trajectory)
        final_context.append(sum(len(t.context_ids) + len(t.response_ids) for t in trajectory.turns))

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.jsonl"
        with TrajectoryWriter(path) as writer:
            stats = collector.run([EpisodeSpec(seed + t) for t in range(batch)], write)
        size = path.stat().st_size
    collector.close()
    tokenize_s = backend.tokenizer.seconds - tokenize_start
    env_s = stats.env_s + stats.reset_s
    rest_s = stats.wall_s - stats.generate_s - env_s - tokenize_s
    n = stats.turns
    return {
        "turns": turns, "batch": batch, "total_turns": n, "wall_s": stats.wall_s,
        "ms_per_turn": 1e3 * stats.wall_s / n, "generate_ms_per_turn": 1e3 * stats.generate_s / n,
        "env_ms_per_turn": 1e3 * env_s / n, "tokenize_ms_per_turn": 1e3 * tokenize_s / n,
        "rest_ms_per_turn": 1e3 * rest_s / n, "bytes": size, "bytes_per_turn": size / n,
        "ms_per_episode": 1e3 * stats.wall_s / stats.episodes, "bytes_per_episode": size / stats.episodes,
        "final_context_tokens": sum(final_context) / len(final_context),
    }


def table(rows: list[dict], key: str) -> str:
    head = (f"| {key} | total turns | final context tokens | wall s | ms/turn | generate ms/turn | env ms/turn "
            "| tokenize ms/turn | rest ms/turn | ms/episode | KiB | bytes/turn |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r[key]} | {r['total_turns']} | {r['final_context_tokens']:.0f} | {r['wall_s']:.2f} | "
            f"{r['ms_per_turn']:.1f} | "
            f"{r['generate_ms_per_turn']:.1f} | {r['env_ms_per_turn']:.2f} | {r['tokenize_ms_per_turn']:.2f} | "
            f"{r['rest_ms_per_turn']:.2f} | {r['ms_per_episode']:.0f} | {r['bytes'] / 1024:.1f} | "
            f"{r['bytes_per_turn']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="textworld/simple-v0")
    parser.add_argument("--model", help="Model folder. Default: the tiny default model.")
    parser.add_argument("--turns", type=int, nargs="+", default=[2, 4, 8, 16], help="Turns-per-episode sweep.")
    parser.add_argument("--turns-batch", type=int, default=8, help="Episodes in flight during the turns sweep.")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16, 64], help="Episodes-in-flight sweep.")
    parser.add_argument("--batch-turns", type=int, default=4, help="Turns per episode during the batch sweep.")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    from agentkit.rollout import SamplingParams
    from agentkit.rollout.hf_backend import HFBackend
    from rollout_throughput import TimedTokenizer  # this folder is on sys.path when run as a script

    from agentkit.models import ensure_default_model

    model_dir = Path(args.model) if args.model else ensure_default_model()
    backend = HFBackend(model_dir, seed=args.seed)
    backend.tokenizer = TimedTokenizer(backend.tokenizer)  # times the collector's encode/decode/template

    backend.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4, stop=()))  # warm up kernels
    print(f"{platform.machine()}, {os.cpu_count()} cores; {args.env}; model {model_dir}; "
          f"{args.max_new_tokens} tokens per response; chat context; {time.strftime('%Y-%m-%d')}\n")
    by_turns = [run(backend, args.env, args.turns_batch, t, args.max_new_tokens, args.seed) for t in args.turns]
    print(f"Turns per episode ({args.turns_batch} episodes in flight):\n")
    print(table(by_turns, "turns") + "\n", flush=True)
    by_batch = [run(backend, args.env, b, args.batch_turns, args.max_new_tokens, args.seed) for b in args.batch]
    print(f"Episodes in flight ({args.batch_turns} turns each):\n")
    print(table(by_batch, "batch"), flush=True)


if __name__ == "__main__":
    main()
