"""Memory and time of one GRPO step at a real model size: fp32 vs bf16 mixed precision vs gradient
checkpointing, full fine-tuning vs LoRA.

    flock /tmp/agentkit-bench.lock python benchmarks/memory_levers.py                 # Qwen3-0.6B's shape
    python benchmarks/memory_levers.py --size base --rows 4 --tokens 256 --steps 1    # a quick look

The model is a random-init Qwen3 of ``--size`` (``agentkit model init --size``: ``qwen3-0.6b`` is
Qwen3-0.6B's shape, 28 layers, hidden 1024, with the locally trained 3k-token vocabulary, so 0.44B
parameters instead of 0.6B: the 151k-token embedding is what it leaves out). The batch is synthetic:
``--rows`` sequences of ``--tokens`` tokens, the second half of each a response with distinct
advantages and recorded logprobs, so GRPO has a gradient. Each configuration runs in a fresh
subprocess: it builds the policy as ``agentkit train`` does (``agentkit.train.load_policy``), its
AdamW over the trained parameters, and runs ``agentkit.train.update`` (the loop's own update):
``--warmup`` untimed steps, then ``--steps`` timed ones. Peak memory is the process's resident
high-water mark (``VmHWM``) after the steps, and the parameter, gradient and optimizer-state bytes
are counted from the tensors. On a CPU, bf16 matrix products are not faster than fp32 unless the
CPU has AMX/AVX512-BF16; the memory figures carry over to a GPU, the times do not.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = {  # name: (train settings)
    "full fp32": {},
    "full bf16": {"precision": "bf16"},
    "full bf16 + checkpointing": {"precision": "bf16", "gradient_checkpointing": True},
    "LoRA r16 fp32": {"lora": {"rank": 16, "alpha": 32}},
    "LoRA r16 bf16": {"lora": {"rank": 16, "alpha": 32}, "precision": "bf16"},
    "LoRA r16 bf16 + checkpointing": {"lora": {"rank": 16, "alpha": 32}, "precision": "bf16",
                                      "gradient_checkpointing": True},
}


def peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def synthetic_batch(rows: int, tokens: int, vocab: int, seed: int):
    import torch
    from agentkit.objectives import TokenBatch

    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (rows, tokens + 1), generator=generator)
    mask = torch.zeros((rows, tokens))
    mask[:, tokens // 2:] = 1.0
    old = -torch.rand((rows, tokens), generator=generator) * 8 * mask
    advantages = torch.linspace(-1.0, 1.5, rows)[:, None] * mask
    return TokenBatch(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=mask, old_logprobs=old,
                      advantages=advantages, weights=mask.clone(), episode_index=torch.arange(rows),
                      turn_index=torch.zeros((rows, tokens), dtype=torch.long)).with_normalizers()


def peak_bytes(device) -> int:
    """The process's peak: the accelerator's allocations on a GPU, the resident set on the CPU."""
    import torch

    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else peak_rss_bytes()


def steps(policy, optimizer, section, rows: int, tokens: int, count: int) -> list[float]:
    """``count`` updates of GRPO (the loop's ``update``) on a synthetic batch; their seconds."""
    import torch
    from agentkit.objectives import make_objective

    from agentkit.train.distributed import SingleProcess
    from agentkit.train.update import update

    ranks = SingleProcess()
    batch = synthetic_batch(rows, tokens, policy.config.vocab_size, 0)
    objective = make_objective("grpo", {"kl_coef": 0.0})
    times = []
    for step in range(count):
        if ranks.device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        stats = update(policy, optimizer, objective, batch, train=section, ranks=ranks, rng=random.Random(step),
                       needs_support=False)
        if ranks.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
        assert stats.skipped == 0
    return times


def longest(args, model_dir: Path, name: str) -> dict:
    """The longest single sequence whose update fits: doubling from ``--tokens`` until out of
    memory, then bisecting to within 256 tokens."""
    import torch

    from agentkit.train import load_policy
    from agentkit.train.config import TrainSection
    from agentkit.train.distributed import SingleProcess

    device = SingleProcess().device
    fits, fails, tokens = 0, None, args.tokens
    while fails is None or fails - fits > 256:
        section = TrainSection(lr=1e-5, micro_batch_tokens=tokens + 1, **CONFIGS[name])
        policy = load_policy(model_dir, section, device=device).train()
        optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=section.lr)
        try:
            steps(policy, optimizer, section, 1, tokens, 1)
            fits = tokens
        except torch.OutOfMemoryError:
            fails = tokens
        del policy, optimizer
        if device.type == "cuda":
            torch.cuda.empty_cache()
        tokens = tokens * 2 if fails is None else (fits + fails) // 2
        if fails is None and tokens > args.max_tokens:
            break
    return {"config": name, "longest_tokens": fits, "first_failing_tokens": fails, "device": str(device)}


def run_one(args, model_dir: Path, name: str) -> dict:
    import torch

    from agentkit.train import load_policy
    from agentkit.train.config import TrainSection
    from agentkit.train.distributed import SingleProcess

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.longest:
        return longest(args, model_dir, name)
    device = SingleProcess().device
    section = TrainSection(lr=1e-5, micro_batch_tokens=args.rows * (args.tokens + 1), **CONFIGS[name])
    started = time.perf_counter()
    policy = load_policy(model_dir, section, device=device).train()
    load_s = time.perf_counter() - started
    trained = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=section.lr)
    times = steps(policy, optimizer, section, args.rows, args.tokens, args.warmup + args.steps)
    param_bytes = sum(p.numel() * p.element_size() for p in policy.parameters())
    grad_bytes = sum(p.grad.numel() * p.grad.element_size() for p in trained if p.grad is not None)
    state_bytes = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                      if torch.is_tensor(t))
    timed = times[args.warmup:]
    return {"config": name, "parameters": sum(p.numel() for p in policy.parameters()),
            "trained_parameters": sum(p.numel() for p in trained), "param_gb": param_bytes / 1e9,
            "grad_gb": grad_bytes / 1e9, "optimizer_gb": state_bytes / 1e9, "peak_gb": peak_bytes(device) / 1e9,
            "device": str(device),
            "step_s": sorted(timed)[len(timed) // 2], "step_s_all": timed, "load_s": load_s,
            "tokens_per_s": args.rows * args.tokens / (sorted(timed)[len(timed) // 2])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="qwen3-0.6b", help="agentkit model init --size")
    parser.add_argument("--rows", type=int, default=2, help="Sequences per step.")
    parser.add_argument("--tokens", type=int, default=256, help="Tokens per sequence (the second half is response).")
    parser.add_argument("--steps", type=int, default=2, help="Timed steps per configuration.")
    parser.add_argument("--warmup", type=int, default=1, help="Untimed steps first.")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--longest", action="store_true",
                        help="Instead: the longest one-sequence update that fits, per configuration (GPU).")
    parser.add_argument("--max-tokens", type=int, default=262144, help="--longest: stop doubling here.")
    parser.add_argument("--model", help="A model folder instead of building --size.")
    parser.add_argument("--results", help="Append the results as JSON lines to this file.")
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.config:  # one configuration, in this subprocess
        Path(args.json).write_text(json.dumps(run_one(args, Path(args.model_dir), args.config)))
        return 0

    from agentkit.core.paths import cache_dir
    from agentkit.models import init_model

    model_dir = Path(args.model) if args.model else cache_dir() / "bench-models" / f"{args.size}-seed0"
    if not (model_dir / "config.json").exists():
        print(f"building a random-init {args.size} model in {model_dir} ...", flush=True)
        init_model(model_dir, size=args.size, seed=0)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.configs:
            out = Path(tmp) / "result.json"
            forwarded = [f"--rows={args.rows}", f"--tokens={args.tokens}", f"--steps={args.steps}",
                         f"--warmup={args.warmup}", f"--threads={args.threads}", f"--max-tokens={args.max_tokens}",
                         *(["--longest"] if args.longest else [])]
            done = subprocess.run([sys.executable, __file__, *forwarded, "--model-dir", str(model_dir), "--config", name,
                                   "--json", str(out)], env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
            if done.returncode != 0:
                print(f"{name}: failed (exit {done.returncode})", flush=True)
                continue
            results.append(json.loads(out.read_text()))
            print(json.dumps(results[-1]), flush=True)
            if args.results:
                with open(args.results, "a") as f:
                    f.write(json.dumps({"size": args.size, **results[-1]}) + "\n")
    if args.longest:
        for r in results:
            print(f"{r['config']}: longest update that fits: {r['longest_tokens']} tokens "
                  f"(fails at {r['first_failing_tokens']})")
        return 0
    print(f"\n{args.size}: {results[0]['parameters'] / 1e6:.0f}M parameters; {args.rows} x {args.tokens} tokens per step, "
          f"{args.threads} threads\n")
    print(f"| configuration | trained parameters | weights GB | gradients GB | AdamW state GB | peak GB ({results[0]['device']}) | step s | "
          "tokens/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['config']} | {r['trained_parameters'] / 1e6:.1f}M | {r['param_gb']:.2f} | {r['grad_gb']:.2f} | "
              f"{r['optimizer_gb']:.2f} | {r['peak_gb']:.2f} | {r['step_s']:.1f} | {r['tokens_per_s']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
