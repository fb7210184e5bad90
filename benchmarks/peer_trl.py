"""Peer benchmark: the same single-turn GRPO workload in agentkit and in TRL's ``GRPOTrainer``.

    flock /tmp/agentkit-bench.lock python benchmarks/peer_trl.py --rounds 5 --steps 8 --warmup 1

agentkit runs through ``agentkit.train.train`` itself (the real loop: Collector -> HFBackend ->
GRPO.prepare -> AdamW), on a one-turn environment registered here (``peer/prompts-v0``: the
observation is one of ``--prompts`` fixed prompts, the step scores the response with
``text_reward`` and ends the episode). TRL gets the same prompts as conversations with agentkit's
system prompt, so both sides see identical prompt tokens, and the same reward function.

Both sides: the default tiny model, fp32, CPU, one process; ``--prompts-per-step`` prompts x
``--group-size`` samples per optimizer step; temperature 1, top-p 1, no top-k, at most
``--max-completion`` tokens (stopping at the end-of-turn token); no KL (beta 0); one pass and one
optimizer step per batch (TRL: num_iterations 1, gradient accumulation 1); token-mean loss
(TRL's ``dapo``); group-std normalized advantages; gradient clipping at 1; AdamW (``adamw_torch``).

TRL runs in two configurations (``TRL_CONFIGS``): ``defaults``, TRL's ``GRPOConfig`` as shipped for
everything the workload does not fix (it turns gradient checkpointing on), and ``expert``, the same
with gradient checkpointing off, as one would set it for a model this small (recomputing the
activations saves memory nobody is short of and costs a second forward pass).

Each side runs in its own subprocess, the three taking turns (the order rotates every round), so
machine noise hits all; before each run the script waits (``--quiet-wait``) for free cores, and it
reports the share of the CPUs other processes took meanwhile. The figures are medians over rounds
of (samples or generated tokens) / wall time of the timed steps, after ``--warmup`` untimed steps.
agentkit's sampling stops at ``</action>`` by default (its agent action format); the script turns
that off so both sides stop only at the end-of-turn token or the length limit. agentkit's loop runs
one extra final step that is not timed (it evaluates and checkpoints at the last step). agentkit's
GRPO defaults to the reference code's KL (``kl_coef`` 0.01, which loads a frozen reference model and
runs it every step); the script sets 0, TRL's ``beta``, so neither side has a reference (until
2026-12-07 it did not, and agentkit's figures paid for a reference TRL never ran). Its other
reference-code defaults (dual-clip 3 on negative advantages, the unbiased group std) change the
loss's values, not its cost. Skips
(exit 0) when trl is missing. ``benchmarks/peer_trl_multiturn.py`` reuses the TRL configurations,
the clocks and the summary here.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agentkit.core import runs

ENV_ID = "peer/prompts-v0"
# TRL's two configurations: its GRPOConfig defaults, and what an expert changes for a tiny model on a CPU
TRL_CONFIGS: dict[str, dict] = {"defaults": {}, "expert": {"gradient_checkpointing": False}}
SIDES = ("agentkit", *(f"trl-{name}" for name in TRL_CONFIGS))
TOPICS = ["the sea", "a red door", "winter", "a lost key", "bread", "the moon", "a small dog", "rain",
          "a library", "trains", "a garden", "coffee", "a mountain", "the wind", "a candle", "music",
          "a bridge", "snow", "an old map", "the river", "a clock", "apples", "a lighthouse", "stars",
          "a market", "fog", "a bicycle", "the forest", "a letter", "sand", "a kite", "the city"]


def prompt_texts(n: int) -> list[str]:
    return [f"Write one short sentence about {TOPICS[i % len(TOPICS)]}." for i in range(n)]


def text_reward(text: str) -> float:
    """Deterministic and cheap: the share of vowels among the letters of the response."""
    letters = [c for c in text.lower() if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0


class PromptEnv:
    """One turn: reset shows prompt ``seed % n``; step scores the whole response and ends."""

    def __init__(self, prompts: int = 32, split: str = "train") -> None:
        self.prompts = prompt_texts(prompts)
        self.split = split

    def _info(self, **extra):
        return {"task": "", "admissible_actions": None, "action_valid": True, "won": False, "score": 0.0,
                "privileged": None, **extra}

    def reset(self, *, seed: int | None = None, options=None):
        return self.prompts[(seed or 0) % len(self.prompts)], self._info()

    def step(self, action: str):
        reward = text_reward(action)
        return "", reward, True, False, self._info(score=reward)

    def close(self) -> None:
        pass


class AgentkitClock:
    """Times agentkit's loop from inside: when each ``Collector.run`` (a step's rollout) starts, and
    each ``HFBackend.generate`` call's seconds and prompt lengths (patched on the classes)."""

    def __init__(self) -> None:
        from agentkit.rollout.collector import Collector
        from agentkit.rollout.hf_backend import HFBackend

        self.run_starts: list[tuple[float, float]] = []  # (wall, process CPU) when each Collector.run starts
        self.calls: list[list[tuple[float, list[int]]]] = []  # per Collector.run: (generate seconds, prompt lengths)
        original_run, original_generate = Collector.run, HFBackend.generate
        clock = self

        def timed_run(self, *a, **k):
            clock.calls.append([])
            clock.run_starts.append((time.perf_counter(), time.process_time()))
            return original_run(self, *a, **k)

        def timed_generate(self, prompts, params, seeds=None):
            start = time.perf_counter()
            out = original_generate(self, prompts, params, seeds)
            clock.calls[-1].append((time.perf_counter() - start, [len(p) for p in prompts]))
            return out

        Collector.run, HFBackend.generate = timed_run, timed_generate

    def result(self, run_dir: Path, warmup: int, steps: int) -> dict:
        """The timed steps (after ``warmup``): a step starts with its rollout, so they run from rollout
        ``warmup`` to rollout ``warmup + steps`` (the final step, which also evaluates, is not timed)."""
        records = [json.loads(line) for line in runs.metrics_file(run_dir).read_text().splitlines() if line.strip()]
        timed = range(warmup, warmup + steps)
        first, last = self.run_starts[warmup], self.run_starts[warmup + steps]
        return {"wall_s": last[0] - first[0], "cpu_s": last[1] - first[1], "window": (first[0], last[0]),
                "tokens": sum(r["tokens"] for r in records[warmup: warmup + steps]),
                "generate_s": sum(seconds for i in timed for seconds, _ in self.calls[i]),
                "generate_calls": sum(len(self.calls[i]) for i in timed),
                # the first call of a rollout prompts every episode's first turn
                "prompt_tokens_mean": statistics.mean(n for i in timed for n in self.calls[i][0][1])}


def run_agentkit(args, model_dir: Path, work: Path) -> dict:
    import torch
    from agentkit.envs import ACTION_TAG, ActionFormat, registry

    from agentkit.train import train

    torch.set_num_threads(args.threads)
    # the <action> format's system prompt without its stop strings (TRL stops only at the end of the sequence)
    registry.register(ENV_ID, PromptEnv, action_format=ActionFormat(ACTION_TAG.instruction), overwrite=True,
                      prompts=args.prompts)
    clock = AgentkitClock()
    run = train(agentkit_config(args, model_dir, work), show_progress=False)
    return clock.result(run.run_dir, args.warmup, args.steps)


def agentkit_config(args, model_dir: Path, work: Path):
    """agentkit's side of the workload: the training settings (TRL's are ``trl_grpo_config``)."""
    from agentkit.train.config import TrainConfig

    total_steps = args.warmup + args.steps + 1  # the last step also evaluates and checkpoints: not timed
    return TrainConfig.model_validate({
        "model": str(model_dir), "out": str(work / "agentkit-run"), "seed": args.seed,
        "env": {"id": ENV_ID, "kwargs": {}, "max_turns": 1, "workers": 0},
        "rollout": {"tasks_per_step": args.prompts_per_step, "group_size": args.group_size},
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": args.max_completion},
        "context": {"show_admissible": False},
        "objective": {"name": "grpo", "args": {"clip_low": 0.2, "clip_high": 0.2, "kl_coef": 0.0}},
        "train": {"steps": total_steps, "lr": 1e-5, "grad_clip": 1.0},
        "eval": {"every": 0, "episodes": 1},
        "checkpoint": {"every": 0, "keep": 1},
    })


def trl_grpo_config(*, out: Path, config: str, seed: int, steps: int, samples: int, group_size: int,
                    max_completion: int, **extra):
    """The GRPOConfig both peers give TRL: the workload's settings, then ``TRL_CONFIGS[config]``."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(out), use_cpu=True, bf16=False, fp16=False, seed=seed,
        max_steps=steps, per_device_train_batch_size=samples, gradient_accumulation_steps=1,
        num_generations=group_size, num_iterations=1, beta=0.0, epsilon=0.2, loss_type="dapo",
        scale_rewards="group", max_completion_length=max_completion, temperature=1.0, top_p=1.0, top_k=0,
        use_vllm=False, learning_rate=1e-5, weight_decay=0.0, max_grad_norm=1.0, optim="adamw_torch",
        lr_scheduler_type="constant", logging_steps=10_000, report_to="none", save_strategy="no",
        eval_strategy="no", disable_tqdm=True, log_completions=False, dataloader_num_workers=0,
        **TRL_CONFIGS[config], **extra,
    )


class TrlClock:
    """Times TRL's trainer from inside: (wall, process CPU) at train begin and at every step's end
    (a callback), and each ``GRPOTrainer._generate_single_turn`` call's step, seconds, generated
    tokens and prompt lengths (patched on the class; the multi-turn tool loop calls it once per turn)."""

    def __init__(self) -> None:
        from transformers import TrainerCallback
        from trl import GRPOTrainer

        self.step_ends: list[tuple[float, float]] = []
        self.calls: list[tuple[int, float, int, list[int]]] = []
        original = GRPOTrainer._generate_single_turn
        clock = self

        def timed_generate(self, prompt_ids, *a, **k):
            start = time.perf_counter()
            completion_ids, logprobs = original(self, prompt_ids, *a, **k)
            clock.calls.append((len(clock.step_ends) - 1, time.perf_counter() - start,
                                sum(len(ids) for ids in completion_ids), [len(p) for p in prompt_ids]))
            return completion_ids, logprobs

        GRPOTrainer._generate_single_turn = timed_generate

        class Clock(TrainerCallback):
            def on_train_begin(self, *a, **k):
                clock.step_ends.append((time.perf_counter(), time.process_time()))

            def on_step_end(self, *a, **k):
                clock.step_ends.append((time.perf_counter(), time.process_time()))

        self.callback = Clock()

    def result(self, warmup: int, steps: int) -> dict:
        """Steps ``warmup`` to ``warmup + steps``; ``step_ends[i]`` is the end of step i (0: train begin)."""
        first, last = warmup, warmup + steps
        timed = [c for c in self.calls if first <= c[0] < last]
        first_calls = [next(c for c in timed if c[0] == step) for step in range(first, last)]
        return {"wall_s": self.step_ends[last][0] - self.step_ends[first][0],
                "cpu_s": self.step_ends[last][1] - self.step_ends[first][1],
                "window": (self.step_ends[first][0], self.step_ends[last][0]),
                "tokens": sum(c[2] for c in timed), "generate_s": sum(c[1] for c in timed), "generate_calls": len(timed),
                "prompt_tokens_mean": statistics.mean(n for c in first_calls for n in c[3])}


def run_trl(args, model_dir: Path, work: Path, config: str) -> dict:
    import torch
    import trl
    from agentkit.rollout.context import DEFAULT_SYSTEM_PROMPT
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    dataset = Dataset.from_list([{"prompt": [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
                                             {"role": "user", "content": text}]} for text in prompt_texts(args.prompts)])

    def reward(completions, **kwargs) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [text_reward(t) for t in texts]

    clock = TrlClock()
    config_args = trl_grpo_config(out=work / "trl-run", config=config, seed=args.seed,
                                  steps=args.warmup + args.steps, samples=args.prompts_per_step * args.group_size,
                                  group_size=args.group_size, max_completion=args.max_completion)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config_args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[clock.callback])
    trainer.train()
    return clock.result(args.warmup, args.steps) | {"trl_version": trl.__version__,
                                                    "gradient_checkpointing": config_args.gradient_checkpointing}


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (``/proc/stat``; 0 where there is none)."""
    try:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    except OSError:
        return 0.0
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def wait_for_cores(cores: int, max_wait_s: float, window_s: float = 2.0) -> float:
    """Wait (up to ``max_wait_s``) until other processes leave ``cores`` CPUs free: on a shared 2-core
    machine one other busy process slows two-thread torch several-fold. The busy share seen last."""
    cpus = os.cpu_count() or 1
    deadline = time.monotonic() + max_wait_s
    while True:
        before = machine_busy_s()
        time.sleep(window_s)
        share = (machine_busy_s() - before) / (window_s * cpus)
        if share < 1 - min(cores, cpus) / cpus + 0.1 or time.monotonic() > deadline:
            return share


def run_side(script: str, forwarded: list[str], side: str, out: Path, quiet_wait_s: float = 0.0,
             threads: int = 2) -> dict:
    """One side's run in its own subprocess (``--side``), after waiting up to ``quiet_wait_s`` for
    ``threads`` free CPUs; its result, with ``foreign_cpu_share``: the share of the machine's CPU
    time that other processes took while it ran (0 on a quiet machine)."""
    if quiet_wait_s > 0:
        wait_for_cores(threads, quiet_wait_s)
    busy, ours, start = machine_busy_s(), resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run([sys.executable, script, *forwarded, "--side", side, "--json", str(out)], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    foreign = machine_busy_s() - busy - (after.ru_utime + after.ru_stime - ours.ru_utime - ours.ru_stime)
    wall = time.perf_counter() - start
    return json.loads(out.read_text()) | {"foreign_cpu_share": max(0.0, foreign) / (wall * (os.cpu_count() or 1))}


def run_this_side(args, run_agentkit, run_trl, model_dir: Path, *extra) -> int:
    """``--side``'s run (``run_agentkit(args, model_dir, work, *extra)`` or ``run_trl(args, model_dir,
    work, *extra, config)``) in a scratch folder; its result to ``--json``."""
    with tempfile.TemporaryDirectory() as tmp:
        if args.side == "agentkit":
            result = run_agentkit(args, model_dir, Path(tmp), *extra)
        else:
            result = run_trl(args, model_dir, Path(tmp), *extra, args.side.removeprefix("trl-"))
        Path(args.json).write_text(json.dumps(result))
    return 0


def rotated(sides: tuple[str, ...], round_index: int) -> list[str]:
    """The sides in the order of this round: each goes first in turn."""
    shift = round_index % len(sides)
    return [*sides[shift:], *sides[:shift]]


def summarize(side: str, results: list[dict], samples_per_step: int, steps: int) -> dict:
    per_round = [{"samples_per_s": samples_per_step * steps / r["wall_s"], "tokens_per_s": r["tokens"] / r["wall_s"],
                  "generate_share": r["generate_s"] / r["wall_s"], "cpu_s_per_sample": r["cpu_s"] / (samples_per_step * steps)}
                 for r in results]
    return {key: statistics.median(p[key] for p in per_round) for key in per_round[0]} | {
        "per_round": per_round, "step_s": statistics.median(r["wall_s"] / steps for r in results),
        "generate_step_s": statistics.median(r["generate_s"] / steps for r in results),
        "prompt_tokens_mean": results[0]["prompt_tokens_mean"],
        "foreign_cpu_share_max": max(r.get("foreign_cpu_share", 0.0) for r in results),
        "tokens_per_sample": statistics.mean(r["tokens"] / (samples_per_step * steps) for r in results)}


def add_run_arguments(parser: argparse.ArgumentParser, *, steps: int, rounds: int) -> None:
    """The timing settings both peers share, and the hidden ones of a side's own subprocess."""
    parser.add_argument("--steps", type=int, default=steps, help="Timed optimizer steps.")
    parser.add_argument("--warmup", type=int, default=1, help="Untimed optimizer steps first.")
    parser.add_argument("--rounds", type=int, default=rounds, help="Runs of each side (the order rotates every round).")
    parser.add_argument("--threads", type=int, default=2, help="torch threads on each side.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet-wait", type=float, default=60.0,
                        help="Before each run, wait up to this many seconds for other processes to leave --threads "
                             "CPUs free.")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32, help="Fixed prompts (the task set).")
    parser.add_argument("--prompts-per-step", type=int, default=4, help="Prompts per optimizer step.")
    parser.add_argument("--group-size", type=int, default=8, help="Samples per prompt (GRPO group).")
    parser.add_argument("--max-completion", type=int, default=32, help="Most generated tokens per sample.")
    add_run_arguments(parser, steps=5, rounds=3)
    args = parser.parse_args()

    if importlib.util.find_spec("trl") is None:
        print("peer_trl: trl is not installed; skipping (pip install -c constraints.txt trl).")
        return 0
    from agentkit.models import ensure_default_model

    model_dir = ensure_default_model()
    if args.side is not None:  # one run, in this subprocess
        return run_this_side(args, run_agentkit, run_trl, model_dir)

    forwarded = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("side", "json", "rounds")]
    results: dict[str, list[dict]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            for side in rotated(SIDES, round_index):
                results[side].append(run_side(__file__, forwarded, side, Path(tmp) / f"{side}-{round_index}.json",
                                              args.quiet_wait, args.threads))
                print(f"round {round_index + 1} {side}: {results[side][-1]}", flush=True)
    samples_per_step = args.prompts_per_step * args.group_size
    summary = {side: summarize(side, rs, samples_per_step, args.steps) for side, rs in results.items()}
    ours = summary["agentkit"]
    print(json.dumps({"trl_version": results["trl-defaults"][0]["trl_version"], "summary": summary}, indent=1))
    print("\n| toolkit | samples/s | generated tok/s | step s | generation s/step | generation share | "
          "CPU s/sample | tokens/sample | other processes' CPU (max) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for side, s in summary.items():
        print(f"| {side} | {s['samples_per_s']:.1f} | {s['tokens_per_s']:.0f} | {s['step_s']:.3f} | "
              f"{s['generate_step_s']:.3f} | {s['generate_share']:.0%} | {s['cpu_s_per_sample']:.3f} | "
              f"{s['tokens_per_sample']:.1f} | {s['foreign_cpu_share_max']:.0%} |")
    print()
    for side in SIDES[1:]:
        theirs = summary[side]
        ratios = [a["samples_per_s"] / t["samples_per_s"]
                  for a, t in zip(ours["per_round"], theirs["per_round"], strict=True)]
        cpu_ratios = [t["cpu_s_per_sample"] / a["cpu_s_per_sample"]
                      for a, t in zip(ours["per_round"], theirs["per_round"], strict=True)]
        print(f"agentkit / {side} samples/s: median {statistics.median(ratios):.2f}x "
              f"(per round: {', '.join(f'{r:.2f}' for r in ratios)}); target >= 1.5x; "
              f"{side} / agentkit CPU s per sample: median {statistics.median(cpu_ratios):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
