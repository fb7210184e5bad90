"""Peer benchmark: the same single-turn GRPO workload in agentkit and in TRL's ``GRPOTrainer``.

    python benchmarks/peer_trl.py --rounds 3 --steps 5 --warmup 1

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
Each side runs in its own subprocess, the two alternating round by round, so machine noise hits
both; the figures are medians over rounds of (samples or generated tokens) / wall time of the
timed steps, after ``--warmup`` untimed steps. agentkit's sampling stops at ``</action>`` by default
(its agent action format); the script turns that off so both sides stop only at the end-of-turn
token or the length limit. agentkit's loop runs one extra final step that is
not timed (it evaluates and checkpoints at the last step). Skips (exit 0) when trl is missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENV_ID = "peer/prompts-v0"
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


def run_agentkit(args, model_dir: Path, work: Path) -> dict:
    import torch
    from agentkit.envs import ACTION_TAG, ActionFormat, registry
    from agentkit.rollout.collector import Collector
    from agentkit.rollout.hf_backend import HFBackend

    from agentkit.train import train
    from agentkit.train_config import TrainConfig

    torch.set_num_threads(args.threads)
    # the <action> format's system prompt without its stop strings (TRL stops only at the end of the sequence)
    registry.register(ENV_ID, PromptEnv, action_format=ActionFormat(ACTION_TAG.instruction), overwrite=True,
                      prompts=args.prompts)
    runs: list[list[float]] = []  # per Collector.run call: generate seconds
    run_starts: list[tuple[float, float]] = []  # (wall, process CPU) when each Collector.run starts
    prompt_lengths: list[int] = []
    original_run, original_generate = Collector.run, HFBackend.generate

    def timed_run(self, *a, **k):
        runs.append([])
        run_starts.append((time.perf_counter(), time.process_time()))
        return original_run(self, *a, **k)

    def timed_generate(self, prompts, params, seeds=None):
        start = time.perf_counter()
        out = original_generate(self, prompts, params, seeds)
        runs[-1].append(time.perf_counter() - start)
        prompt_lengths.extend(len(p) for p in prompts)
        return out

    Collector.run, HFBackend.generate = timed_run, timed_generate
    total_steps = args.warmup + args.steps + 1  # the last step also evaluates and checkpoints: not timed
    cfg = TrainConfig.model_validate({
        "model": str(model_dir), "out": str(work / "agentkit-run"), "seed": args.seed,
        "env": {"id": ENV_ID, "kwargs": {}, "max_turns": 1, "workers": 0},
        "rollout": {"tasks_per_step": args.prompts_per_step, "group_size": args.group_size},
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": args.max_completion},
        "context": {"show_admissible": False},
        "objective": {"name": "grpo", "args": {"clip_low": 0.2, "clip_high": 0.2}},
        "train": {"steps": total_steps, "lr": 1e-5, "grad_clip": 1.0},
        "eval": {"every": 0, "episodes": 1},
        "checkpoint": {"every": 0, "keep": 1},
    })
    run_dir = train(cfg, show_progress=False).run_dir
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    timed = records[args.warmup: args.warmup + args.steps]
    # a step starts with its rollout: timed steps run from rollout W to rollout W + steps (not the final evaluation)
    first, last = run_starts[args.warmup], run_starts[args.warmup + args.steps]
    return {"wall_s": last[0] - first[0], "cpu_s": last[1] - first[1], "tokens": sum(r["tokens"] for r in timed),
            "generate_s": sum(sum(runs[i]) for i in range(args.warmup, args.warmup + args.steps)),
            "generate_calls": sum(len(runs[i]) for i in range(args.warmup, args.warmup + args.steps)),
            "prompt_tokens_mean": statistics.mean(prompt_lengths)}


def run_trl(args, model_dir: Path, work: Path) -> dict:
    import torch
    import trl
    from agentkit.rollout.context import DEFAULT_SYSTEM_PROMPT
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    dataset = Dataset.from_list([{"prompt": [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
                                             {"role": "user", "content": text}]} for text in prompt_texts(args.prompts)])
    step_ends: list[tuple[float, float]] = []  # (wall, process CPU)
    generate_s: list[float] = []
    tokens: list[int] = []
    prompt_lengths: list[int] = []

    def reward(completions, completion_ids=None, **kwargs) -> list[float]:
        tokens.append(sum(len(ids) for ids in completion_ids))
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [text_reward(t) for t in texts]

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            step_ends.append((time.perf_counter(), time.process_time()))

        def on_step_end(self, *a, **k):
            step_ends.append((time.perf_counter(), time.process_time()))

    original = GRPOTrainer._generate_single_turn

    def timed_generate(self, prompt_ids, *a, **k):
        start = time.perf_counter()
        out = original(self, prompt_ids, *a, **k)
        generate_s.append(time.perf_counter() - start)
        prompt_lengths.extend(len(p) for p in prompt_ids)
        return out

    GRPOTrainer._generate_single_turn = timed_generate
    samples = args.prompts_per_step * args.group_size
    config = GRPOConfig(
        output_dir=str(work / "trl-run"), use_cpu=True, bf16=False, fp16=False, seed=args.seed,
        max_steps=args.warmup + args.steps, per_device_train_batch_size=samples, gradient_accumulation_steps=1,
        num_generations=args.group_size, num_iterations=1, beta=0.0, epsilon=0.2, loss_type="dapo",
        scale_rewards="group", max_completion_length=args.max_completion, temperature=1.0, top_p=1.0, top_k=0,
        use_vllm=False, learning_rate=1e-5, weight_decay=0.0, max_grad_norm=1.0, optim="adamw_torch",
        lr_scheduler_type="constant", logging_steps=10_000, report_to="none", save_strategy="no",
        eval_strategy="no", disable_tqdm=True, log_completions=False, dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[Clock()])
    trainer.train()
    first, last = args.warmup, args.warmup + args.steps  # step_ends[i]: end of step i (0: train begin)
    return {"wall_s": step_ends[last][0] - step_ends[first][0], "cpu_s": step_ends[last][1] - step_ends[first][1],
            "tokens": sum(tokens[first:last]),
            "generate_s": sum(generate_s[first:last]), "generate_calls": len(generate_s[first:last]),
            "prompt_tokens_mean": statistics.mean(prompt_lengths), "trl_version": trl.__version__}


def summarize(side: str, results: list[dict], samples_per_step: int, steps: int) -> dict:
    per_round = [{"samples_per_s": samples_per_step * steps / r["wall_s"], "tokens_per_s": r["tokens"] / r["wall_s"],
                  "generate_share": r["generate_s"] / r["wall_s"], "cpu_s_per_sample": r["cpu_s"] / (samples_per_step * steps)}
                 for r in results]
    return {key: statistics.median(p[key] for p in per_round) for key in per_round[0]} | {
        "per_round": per_round, "step_s": statistics.median(r["wall_s"] / steps for r in results),
        "generate_step_s": statistics.median(r["generate_s"] / steps for r in results),
        "prompt_tokens_mean": results[0]["prompt_tokens_mean"],
        "tokens_per_sample": statistics.mean(r["tokens"] / (samples_per_step * steps) for r in results)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32, help="Fixed prompts (the task set).")
    parser.add_argument("--prompts-per-step", type=int, default=4, help="Prompts per optimizer step.")
    parser.add_argument("--group-size", type=int, default=8, help="Samples per prompt (GRPO group).")
    parser.add_argument("--max-completion", type=int, default=32, help="Most generated tokens per sample.")
    parser.add_argument("--steps", type=int, default=5, help="Timed optimizer steps.")
    parser.add_argument("--warmup", type=int, default=1, help="Untimed optimizer steps first.")
    parser.add_argument("--rounds", type=int, default=3, help="Alternating runs of each side.")
    parser.add_argument("--threads", type=int, default=2, help="torch threads on each side.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--side", choices=["agentkit", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if importlib.util.find_spec("trl") is None:
        print("peer_trl: trl is not installed; skipping (pip install -c constraints.txt trl).")
        return 0
    from agentkit.models import ensure_default_model

    model_dir = ensure_default_model()
    if args.side is not None:  # one run, in this subprocess
        with tempfile.TemporaryDirectory() as tmp:
            run = run_agentkit if args.side == "agentkit" else run_trl
            Path(args.json).write_text(json.dumps(run(args, model_dir, Path(tmp))))
        return 0

    forwarded = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("side", "json", "rounds")]
    results: dict[str, list[dict]] = {"agentkit": [], "trl": []}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            order = ["agentkit", "trl"] if round_index % 2 == 0 else ["trl", "agentkit"]
            for side in order:
                out = Path(tmp) / f"{side}-{round_index}.json"
                subprocess.run([sys.executable, __file__, *forwarded, "--side", side, "--json", str(out)], check=True)
                results[side].append(json.loads(out.read_text()))
                print(f"round {round_index + 1} {side}: {results[side][-1]}", flush=True)
    samples_per_step = args.prompts_per_step * args.group_size
    summary = {side: summarize(side, rs, samples_per_step, args.steps) for side, rs in results.items()}
    ours, theirs = summary["agentkit"], summary["trl"]
    ratios = [a["samples_per_s"] / t["samples_per_s"] for a, t in zip(ours["per_round"], theirs["per_round"], strict=True)]
    print(json.dumps({"trl_version": results["trl"][0]["trl_version"], "summary": summary, "ratio_per_round": ratios},
                     indent=1))
    cpu_ratios = [t["cpu_s_per_sample"] / a["cpu_s_per_sample"]
                  for a, t in zip(ours["per_round"], theirs["per_round"], strict=True)]
    print("\n| toolkit | samples/s | generated tok/s | step s | generation s/step | generation share | "
          "CPU s/sample | tokens/sample |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for side, s in summary.items():
        print(f"| {side} | {s['samples_per_s']:.1f} | {s['tokens_per_s']:.0f} | {s['step_s']:.3f} | "
              f"{s['generate_step_s']:.3f} | {s['generate_share']:.0%} | {s['cpu_s_per_sample']:.3f} | "
              f"{s['tokens_per_sample']:.1f} |")
    print(f"\nagentkit / TRL samples/s: median {statistics.median(ratios):.2f}x "
          f"(per round: {', '.join(f'{r:.2f}' for r in ratios)}); target >= 1.5x")
    print(f"TRL / agentkit CPU seconds per sample: median {statistics.median(cpu_ratios):.2f}x "
          f"(per round: {', '.join(f'{r:.2f}' for r in cpu_ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
