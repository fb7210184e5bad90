"""The transformers backend's prefix cache: what multi-turn chat episodes cost with it on and off.

    python benchmarks/prefix_cache.py --report benchmarks/results/prefix_cache.md

1. **Collector**: ``--batch`` chat-mode episodes of ``--turns`` turns (vaults, pure Python; the
   untrained default model's whole answer is sent as the command, so every turn steps the game and
   the episode runs all its turns), ``--max-new-tokens`` tokens per answer (no stop string: every
   turn the same work), through ``Collector`` with ``--prefix-cache-mb 0`` (off) and the default (on),
   ``--rounds`` rounds alternating which goes first. Reported: wall time, tokens the model read per
   generated token, and whether both sampled the same tokens (they must: the cache changes no token).
2. **A long episode**: ``--long-rows`` conversations grown by an answer and an observation of
   ``--obs-tokens`` tokens every turn for ``--long-turns`` turns (ScienceWorld runs up to 300), one
   batched generate per turn, cache off and on: seconds per turn against the turn. Without the cache a
   turn re-reads the whole conversation (its cost grows with the turn, the episode's quadratically);
   with it a turn reads its new tokens only.

The model is the tiny default one (fp32, CPU, this process's torch threads). Run it on a quiet
machine: the figures are wall times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from datetime import date
from pathlib import Path

from agentkit.core.settings import ContextSettings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ENV_ID = "vaults/vaults-v0"


def collector_round(model_dir: Path, *, prefix_cache_mb: int | None, batch: int, turns: int,
                    max_new_tokens: int) -> dict:
    from agentkit.envs import ActionParser, make
    from agentkit.rollout import Collector, EpisodeSpec, SamplingParams
    from agentkit.rollout.hf_backend import HFBackend

    backend = HFBackend(model_dir, seed=0, prefix_cache_mb=prefix_cache_mb)
    backend.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2))  # warm up
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, stop=())
    collector = Collector(backend, lambda: make(ENV_ID, max_turns=turns, action_parser=ActionParser(require_match=False),
                                                families="amber", chambers=turns, moves=turns),
                          env_id=ENV_ID, sampling=params, context=ContextSettings(mode="chat"))
    found = []
    read, asked = backend.prefilled_tokens, backend.prompt_tokens
    start = time.perf_counter()
    stats = collector.run([EpisodeSpec(seed) for seed in range(batch)], found.append)
    wall = time.perf_counter() - start
    collector.close()
    tokens = {t.id: [turn.response_ids for turn in t.turns] for t in found}
    return {"wall_s": wall, "generate_s": stats.generate_s, "generated": stats.generated_tokens,
            "read": backend.prefilled_tokens - read, "prompt_tokens": backend.prompt_tokens - asked,
            "turns": statistics.fmean(len(t.turns) for t in found), "tokens": tokens}


def long_episode(model_dir: Path, *, prefix_cache_mb: int | None, rows: int, turns: int, obs_tokens: int,
                 max_new_tokens: int) -> list[float]:
    from agentkit.rollout import SamplingParams
    from agentkit.rollout.hf_backend import HFBackend

    backend = HFBackend(model_dir, seed=0, prefix_cache_mb=prefix_cache_mb)
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, stop=())
    rng = random.Random(0)
    vocab = backend.tokenizer.vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(64)] for _ in range(rows)]
    backend.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2))
    seconds = []
    for turn in range(turns):
        start = time.perf_counter()
        out = backend.generate(prompts, params, [1000 * r + turn for r in range(rows)])
        seconds.append(time.perf_counter() - start)
        prompts = [p + g.token_ids + [rng.randrange(vocab) for _ in range(obs_tokens)] for p, g in zip(prompts, out, strict=True)]
    return seconds


def plot(long: dict[str, list[float]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, seconds in long.items():
        ax.plot(range(1, len(seconds) + 1), seconds, label=name)
    ax.set_xlabel("turn")
    ax.set_ylabel("seconds per turn (one batched generate)")
    ax.set_title("a long chat episode, prefix cache off and on")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def report(result: dict, path: Path) -> None:
    c, lg = result["collector"], result["long"]
    lines = ["# The transformers backend's prefix cache", "",
             f"Made by `python benchmarks/prefix_cache.py {' '.join(result['argv'])}` on {result['machine']}, "
             f"{result['date']}; model: the tiny default one (fp32, CPU, {result['threads']} torch threads).", "",
             f"## Collector: {c['batch']} chat-mode vaults episodes x {c['turns']} turns, {c['max_new_tokens']} tokens "
             f"per answer ({c['rounds']} rounds each, alternating)", "",
             "| prefix cache | wall s per round (each round) | generate s | tokens read per generated token |",
             "|---|---|---:|---:|"]
    for name in ("off", "on"):
        rows = c[name]
        lines.append(f"| {name} | {statistics.median(r['wall_s'] for r in rows):.2f} "
                     f"({', '.join(format(r['wall_s'], '.2f') for r in rows)}) | "
                     f"{statistics.median(r['generate_s'] for r in rows):.2f} | "
                     f"{statistics.fmean(r['read'] / r['generated'] for r in rows):.1f} |")
    lines += ["", f"Speed-up of the collector's wall time: **{c['speedup']:.2f}x** (median round off / median round on). "
              f"Both sampled the same tokens in every episode and turn: {c['same_tokens']}.", "",
              f"## A long episode: {lg['rows']} conversations x {lg['turns']} turns, +{lg['max_new_tokens']} answer "
              f"and +{lg['obs_tokens']} observation tokens per turn (last prompt {lg['last_prompt']} tokens)", "",
              "| prefix cache | whole episode s | s per turn, turns 1-10 | turns 141-150 | last 10 turns |",
              "|---|---:|---:|---:|---:|"]
    for name in ("off", "on"):
        s = lg[name]
        mid = s[140:150] or s[len(s) // 2:len(s) // 2 + 10]
        lines.append(f"| {name} | {sum(s):.1f} | {statistics.fmean(s[:10]):.4f} | {statistics.fmean(mid):.4f} | "
                     f"{statistics.fmean(s[-10:]):.4f} |")
    lines += ["", "Without the cache a turn's cost grows with the conversation (the episode's, quadratically); with "
              "it a turn reads only its new tokens, so its cost grows only with attention over the kept keys.", ""]
    image = path.with_suffix(".png")
    if plot({"off": lg["off"], "on": lg["on"]}, image):
        lines += [f"![seconds per turn]({image.name})", ""]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="Model folder (default: the tiny default model).")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--turns", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--long-rows", type=int, default=4)
    parser.add_argument("--long-turns", type=int, default=300)
    parser.add_argument("--obs-tokens", type=int, default=10)
    parser.add_argument("--long-max-new-tokens", type=int, default=16)
    parser.add_argument("--report", help="Markdown report (a PNG beside it).")
    parser.add_argument("--json", help="Write the figures as JSON here.")
    args = parser.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    import torch

    from agentkit.models import ensure_default_model

    model_dir = Path(args.model) if args.model else ensure_default_model()
    settings = {"off": 0, "on": None}
    collector = {"batch": args.batch, "turns": args.turns, "max_new_tokens": args.max_new_tokens, "rounds": args.rounds,
                 "off": [], "on": []}
    for round_ in range(args.rounds):
        for name in (("off", "on") if round_ % 2 == 0 else ("on", "off")):
            row = collector_round(model_dir, prefix_cache_mb=settings[name], batch=args.batch, turns=args.turns,
                                  max_new_tokens=args.max_new_tokens)
            collector[name].append(row)
            print(f"collector {name}: {row['wall_s']:.2f} s, read/generated {row['read'] / row['generated']:.1f}", flush=True)
    collector["same_tokens"] = all(a["tokens"] == b["tokens"] for a, b in zip(collector["off"], collector["on"], strict=True))
    collector["speedup"] = (statistics.median(r["wall_s"] for r in collector["off"])
                            / statistics.median(r["wall_s"] for r in collector["on"]))
    for name in ("off", "on"):
        for row in collector[name]:
            del row["tokens"]
    long = {"rows": args.long_rows, "turns": args.long_turns, "obs_tokens": args.obs_tokens,
            "max_new_tokens": args.long_max_new_tokens,
            "last_prompt": 64 + (args.long_turns - 1) * (args.long_max_new_tokens + args.obs_tokens)}
    for name in ("off", "on"):
        long[name] = long_episode(model_dir, prefix_cache_mb=settings[name], rows=args.long_rows, turns=args.long_turns,
                                  obs_tokens=args.obs_tokens, max_new_tokens=args.long_max_new_tokens)
        print(f"long episode {name}: {sum(long[name]):.1f} s", flush=True)
    result = {"argv": argv if argv is not None else __import__("sys").argv[1:], "collector": collector, "long": long,
              "machine": f"{platform.machine()}, {os.cpu_count()} cores", "date": str(date.today()),
              "threads": torch.get_num_threads()}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.report:
        report(result, Path(args.report))
        print(f"wrote {args.report}")


if __name__ == "__main__":
    main()
