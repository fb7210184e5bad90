"""Collector tokens/s versus the raw backend's batched generate, same model, batches and lengths.

One run measures both: the collector plays B episodes at once (one batched generate per turn)
while a recording wrapper keeps every (prompt, seed) it sent to the backend; then the same work is
replayed straight into ``backend.generate``, so both sides generate exactly the same tokens. The
replay groups the recorded prompts by turn, every episode's turn t in one batch, in episode order:
the batches an ideal collector sends. In process that is exactly what the collector sent; with
environment workers episodes come back in timing-dependent order and the collector may split a
turn over several calls, which the ratio then counts against it (a split batch is lost throughput).
Every round must repeat the first round's work (the same prompts and seeds: each row samples from
its own seed), however it was batched. ratio = collector tokens/s / raw tokens/s. The rest of the
collector's time is split into environment reset and stepping, tokenization (chat template, encode,
decode: timed through a tokenizer proxy), writing the JSONL, and the remaining bookkeeping (turn and
trajectory assembly, the event loop). ``--profile N`` also prints the collector run's N costliest
functions by own time (cProfile; it slows the run, so its ratio is not comparable).

    python benchmarks/rollout_throughput.py --env textworld/simple-v0 --batch 16 --turns 6
    ~/.cache/agentkit/venv-vllm/bin/python benchmarks/rollout_throughput.py --backend vllm --model DIR

vLLM's prefix cache is reset before each side, so the replay does not reuse the collector's
prefills (chat-mode turns still reuse earlier turns' prefixes on both sides alike).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import json
import os
import platform
import pstats
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path

from agentkit.core.settings import ContextSettings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class TimedTokenizer:
    """Forwards to a tokenizer, adding up the time spent encoding, decoding and templating."""

    def __init__(self, inner):
        self._inner = inner
        self.seconds = 0.0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __len__(self) -> int:  # special methods bypass __getattr__
        return len(self._inner)

    def _timed(self, method, *args, **kwargs):
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start

    def __call__(self, *args, **kwargs):
        return self._timed(self._inner, *args, **kwargs)

    def decode(self, *args, **kwargs):
        return self._timed(self._inner.decode, *args, **kwargs)

    def apply_chat_template(self, *args, **kwargs):
        return self._timed(self._inner.apply_chat_template, *args, **kwargs)


class RecordingBackend:
    """Passes generate() through and records each prompt batch; times the collector's tokenizer use."""

    def __init__(self, inner):
        self.inner = inner
        self.tokenizer, self.name, self.max_context = TimedTokenizer(inner.tokenizer), inner.name, inner.max_context
        self.batches: list[tuple[list[list[int]], list[int] | None]] = []

    def generate(self, prompts, params, seeds=None):
        self.batches.append(([list(p) for p in prompts], list(seeds) if seeds is not None else None))
        return self.inner.generate(prompts, params, seeds)


def by_turn(batches, turn_of: dict[int, tuple[int, int]]) -> list[tuple[list[list[int]], list[int]]]:
    """The recorded (prompt, seed) rows regrouped one batch per turn, in episode order.

    ``turn_of`` maps each row seed to its (turn, episode index). The result depends only on which
    rows were sent, not on how the collector happened to batch or order them.
    """
    rows = sorted((turn_of[seed], prompt, seed) for prompts, seeds in batches for prompt, seed in zip(prompts, seeds, strict=True))
    grouped: list[tuple[list[list[int]], list[int]]] = []
    for (turn, _), prompt, seed in rows:
        if turn >= len(grouped):
            grouped.extend(([], []) for _ in range(turn + 1 - len(grouped)))
        grouped[turn][0].append(prompt)
        grouped[turn][1].append(seed)
    return [batch for batch in grouped if batch[0]]


def load_backend(kind: str, model_dir: Path, seed: int, vllm_args: dict):
    if kind == "vllm":
        from agentkit.rollout.vllm_backend import VLLMBackend

        return VLLMBackend(model_dir, seed=seed, **vllm_args)
    from agentkit.rollout.hf_backend import HFBackend

    return HFBackend(model_dir, seed=seed)


def reset_caches(backend) -> None:
    """Drop the backend's prefix cache so one side does not reuse the other's prefills."""
    backend.reset_prefix_cache()


def measure(env_id: str, backend, batch: int, turns: int, max_new_tokens: int, context: str, seed: int,
            env_kwargs: dict, env_workers: int = 0, profile_top: int = 0, rounds: int = 1) -> dict:
    from agentkit.envs import ActionParser, make
    from agentkit.rollout import Collector, EpisodeSpec, SamplingParams
    from agentkit.rollout.collector import RolloutStats, turn_seed
    from agentkit.rollout.workers import InProcessEnvs, WorkerPool

    from agentkit.core.jsonl import TrajectoryWriter

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
    specs = [EpisodeSpec(seed + t) for t in range(batch)]
    turn_of = {turn_seed(params.seed, spec.seed, spec.sample, turn): (turn, index)
               for index, spec in enumerate(specs) for turn in range(turns)}

    def collect(profiler: cProfile.Profile | None) -> tuple[RolloutStats, float, float]:
        """One collector run: its stats, tokenizer seconds and writer seconds."""
        envs = WorkerPool(make_env, env_workers) if env_workers else InProcessEnvs(make_env)
        if env_workers:  # start the worker processes (interpreter + imports) outside the timed region
            for slot in range(env_workers):
                envs.submit(slot, "reset", seed)
            started = 0
            while started < env_workers:
                started += len(envs.poll(None))
        collector = Collector(recorder, envs, env_id=env_id, sampling=params, context=ContextSettings(mode=context))
        tokenizing_s = recorder.tokenizer.seconds  # the chat template rendered once at construction
        write_s = 0.0

        def write(trajectory) -> None:
            nonlocal write_s
            start = time.perf_counter()
            writer.write(trajectory)
            write_s += time.perf_counter() - start

        reset_caches(backend)
        recorder.batches.clear()
        with tempfile.TemporaryDirectory() as tmp, TrajectoryWriter(Path(tmp) / "t.jsonl") as writer:
            if profiler is not None:
                profiler.enable()
            stats = collector.run(specs, write)
            if profiler is not None:
                profiler.disable()
        collector.close()
        return stats, recorder.tokenizer.seconds - tokenizing_s, write_s

    def replay(batches) -> tuple[int, float]:
        reset_caches(backend)
        tokens, start = 0, time.perf_counter()
        for prompts, seeds in batches:
            tokens += sum(len(g.token_ids) for g in backend.generate(prompts, params, seeds))
        return tokens, time.perf_counter() - start

    # rounds alternate which side goes first (after the first, which records the work), so a change
    # in the machine's load between the two sides evens out; the figures are sums over rounds
    profiler = cProfile.Profile() if profile_top else None
    stats, tokenizing_s, write_s, raw_tokens, raw_s, round_ratios = RolloutStats(), 0.0, 0.0, 0, 0.0, []
    work = None  # the first round's rows, one batch per turn: what every round replays
    generate_calls, as_sent = [], True
    for round_ in range(rounds):
        if round_ % 2:
            tokens, seconds = replay(work)
            run_stats, tok_s, wr_s = collect(profiler)
        else:
            run_stats, tok_s, wr_s = collect(profiler)
            work = work or by_turn(recorder.batches, turn_of)
            tokens, seconds = replay(work)
        if by_turn(recorder.batches, turn_of) != work:
            raise RuntimeError("the collector sent different prompts or seeds in two rounds (not just a different "
                               "batching); the comparison needs identical work")
        as_sent = as_sent and [(list(p), list(s)) for p, s in recorder.batches] == work
        generate_calls.append(len(recorder.batches))
        assert tokens == run_stats.generated_tokens, (tokens, run_stats.generated_tokens)
        round_ratios.append(round((run_stats.generated_tokens / run_stats.wall_s) / (tokens / seconds), 3))
        raw_tokens, raw_s, tokenizing_s, write_s = raw_tokens + tokens, raw_s + seconds, tokenizing_s + tok_s, write_s + wr_s
        for name in ("generated_tokens", "wall_s", "generate_s", "env_s", "reset_s"):
            setattr(stats, name, getattr(stats, name) + getattr(run_stats, name))
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(profile_top)
        print(out.getvalue(), flush=True)

    collector_tps = stats.generated_tokens / stats.wall_s
    raw_tps = raw_tokens / raw_s
    # with env workers the env shares are the workers' time summed over episodes, which overlaps
    # generation and each other: wall time without it, and the remainder, then mean nothing (None)
    in_process = not env_workers
    other_s = stats.wall_s - stats.generate_s - stats.env_s - stats.reset_s - tokenizing_s - write_s
    return {
        "backend": type(backend).__name__, "env": env_id, "env_workers": env_workers, "batch": batch, "turns": turns, "max_new_tokens": max_new_tokens, "context": context,
        "rounds": rounds, "round_ratios": round_ratios, "round_ratio_median": statistics.median(round_ratios),
        "tokens": raw_tokens,
        # the collector's calls per round, and the replay's (one per turn); the batches were
        # exactly the replay's in every round (always so in process) when batches_as_replayed
        "generate_calls": generate_calls, "raw_generate_calls": len(work), "batches_as_replayed": as_sent,
        "collector_tokens_per_s": round(collector_tps, 1), "raw_tokens_per_s": round(raw_tps, 1),
        "ratio": round(collector_tps / raw_tps, 3),
        "ratio_without_env_time": round(stats.generated_tokens / (stats.wall_s - stats.env_s - stats.reset_s) / raw_tps, 3)
        if in_process else None,
        # the same generate calls timed on both sides when batches_as_replayed: far from 1 means the
        # machine's load drifted; otherwise it also holds the cost of the collector's split batches
        "raw_s_over_collector_generate_s": round(raw_s / stats.generate_s, 3),
        "share_generate": round(stats.generate_s / stats.wall_s, 3),
        "share_env_step": round(stats.env_s / stats.wall_s, 3),
        "share_env_reset": round(stats.reset_s / stats.wall_s, 3),
        "share_tokenize": round(tokenizing_s / stats.wall_s, 3),
        "share_write": round(write_s / stats.wall_s, 3),
        "share_bookkeeping": round(other_s / stats.wall_s, 3) if in_process else None,
        "profiled": bool(profile_top),
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
    parser.add_argument("--backend", default="hf", choices=["hf", "vllm"],
                        help="Generation backend (vllm: run with a Python that has vLLM).")
    parser.add_argument("--vllm-args", type=json.loads, default={},
                        help='Extra VLLMBackend keyword arguments as JSON, e.g. \'{"enforce_eager": true}\'.')
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="Print the collector run's N costliest functions (cProfile; slows the run).")
    parser.add_argument("--rounds", type=int, default=1,
                        help="Collector/replay rounds, alternating which side goes first (for a noisy machine).")
    parser.add_argument("--json", help="Append the results as JSON lines to this file.")
    args = parser.parse_args()

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    from agentkit.models import ensure_default_model

    model_dir = Path(args.model) if args.model else ensure_default_model()
    backend = load_backend(args.backend, model_dir, args.seed, args.vllm_args)
    rows = []
    for env_id in args.env or ["textworld/simple-v0", "textworld/coin-v0"]:
        for workers in args.env_workers:
            row = measure(env_id, backend, args.batch, args.turns, args.max_new_tokens, args.context, args.seed, {},
                          workers, args.profile, args.rounds)
            row.update(machine=f"{platform.machine()}, {os.cpu_count()} cores", date=str(date.today()),
                       model=str(model_dir), prefix_caching=backend.prefix_caching)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
