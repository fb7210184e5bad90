"""Collector tokens/s versus the raw backend's batched generate, same model, batches and lengths.

One run measures both: the collector plays B episodes at once (one batched generate per turn)
while a recording wrapper keeps every prompt batch it sent to the backend; then the same batches
are replayed straight into ``backend.generate`` with the same sampler seed, so both sides generate
exactly the same tokens. ratio = collector tokens/s / raw tokens/s. The rest of the collector's
time is split into environment stepping and bookkeeping (tokenization, trajectory assembly,
writing).

    python benchmarks/rollout_throughput.py --env textworld/simple-v0 --batch 16 --turns 6
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import tempfile
import time
from datetime import date
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class RecordingBackend:
    """Passes generate() through and records each prompt batch."""

    def __init__(self, inner):
        self.inner = inner
        self.tokenizer, self.name, self.max_context = inner.tokenizer, inner.name, inner.max_context
        self.batches: list[list[list[int]]] = []

    def generate(self, prompts, params, seeds=None):
        self.batches.append(([list(p) for p in prompts], list(seeds) if seeds is not None else None))
        return self.inner.generate(prompts, params, seeds)


def measure(env_id: str, model_dir: Path, batch: int, turns: int, max_new_tokens: int, context: str, seed: int,
            env_kwargs: dict, env_workers: int = 0) -> dict:
    from agentkit.envs import ActionParser, make
    from agentkit.rollout import Collector, EpisodeSpec, SamplingParams
    from agentkit.rollout.hf_backend import HFBackend
    from agentkit.rollout.workers import InProcessEnvs, WorkerPool

    from agentkit.core.jsonl import TrajectoryWriter

    backend = HFBackend(model_dir, seed=seed)
    # fixed-length responses on both sides: no stop strings, so every batch is the same work
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, stop=(), seed=seed)
    # the untrained model rarely writes <action> tags; sending its whole text as the command makes the
    # environment really step every turn, as it does for a trained policy
    parser = ActionParser(require_match=False)

    make_env = functools.partial(make, env_id, max_turns=turns, action_parser=parser, **env_kwargs)
    warm = make_env()  # generate (or load) the games outside the timed region
    for task in range(batch):
        warm.reset(seed=seed + task)
    warm.close()
    backend.generate([[1, 2, 3]], params)  # warm up kernels

    recorder = RecordingBackend(backend)
    envs = WorkerPool(make_env, env_workers) if env_workers else InProcessEnvs(make_env)
    if env_workers:  # start the worker processes (interpreter + imports) outside the timed region
        for slot in range(env_workers):
            envs.submit(slot, "reset", seed)
        started = 0
        while started < env_workers:
            started += len(envs.poll(None))
    collector = Collector(recorder, envs, env_id=env_id, sampling=params, context=context)
    backend.reseed(seed)
    with tempfile.TemporaryDirectory() as tmp, TrajectoryWriter(Path(tmp) / "t.jsonl") as writer:
        stats = collector.run([EpisodeSpec(seed + t) for t in range(batch)], writer.write)
    collector.close()

    backend.reseed(seed)
    raw_tokens, start = 0, time.perf_counter()
    for prompts, seeds in recorder.batches:
        raw_tokens += sum(len(g.token_ids) for g in backend.generate(prompts, params, seeds))
    raw_s = time.perf_counter() - start
    assert raw_tokens == stats.generated_tokens, (raw_tokens, stats.generated_tokens)

    collector_tps = stats.generated_tokens / stats.wall_s
    raw_tps = raw_tokens / raw_s
    other_s = stats.wall_s - stats.generate_s - stats.env_s - stats.reset_s
    return {
        "env": env_id, "env_workers": env_workers, "batch": batch, "turns": turns, "max_new_tokens": max_new_tokens, "context": context,
        "tokens": raw_tokens, "generate_calls": len(recorder.batches),
        "collector_tokens_per_s": round(collector_tps, 1), "raw_tokens_per_s": round(raw_tps, 1),
        "ratio": round(collector_tps / raw_tps, 3),
        "ratio_without_env_time": round(stats.generated_tokens / (stats.wall_s - stats.env_s - stats.reset_s) / raw_tps, 3),
        "share_generate": round(stats.generate_s / stats.wall_s, 3),
        "share_env_step": round(stats.env_s / stats.wall_s, 3),
        "share_env_reset": round(stats.reset_s / stats.wall_s, 3),
        "share_bookkeeping": round(other_s / stats.wall_s, 3),
        "generation_idle_share": round(stats.generation_idle_s / stats.wall_s, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", action="append", help="Environment id (repeatable). Default: textworld/simple-v0 and textworld/coin-v0.")
    parser.add_argument("--model", help="Model folder. Default: the tiny default model.")
    parser.add_argument("--batch", type=int, default=16, help="Episodes in flight (the generate batch size).")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--context", default="chat", choices=["chat", "window"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--env-workers", type=int, nargs="+", default=[0, 2],
                        help="Worker-process counts to measure (0 = environments in the collector's process).")
    parser.add_argument("--json", help="Append the results as JSON lines to this file.")
    args = parser.parse_args()

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    from agentkit.models import ensure_default_model

    model_dir = Path(args.model) if args.model else ensure_default_model()
    rows = []
    for env_id in args.env or ["textworld/simple-v0", "textworld/coin-v0"]:
        for workers in args.env_workers:
            row = measure(env_id, model_dir, args.batch, args.turns, args.max_new_tokens, args.context, args.seed, {},
                          workers)
            row.update(machine=f"{platform.machine()}, {os.cpu_count()} cores", date=str(date.today()),
                       model=str(model_dir))
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
