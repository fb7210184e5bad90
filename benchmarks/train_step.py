"""One optimizer step of every built-in objective versus a plain NLL step, same model and batch.

The batch is real: 16 episodes (4 tasks x 4 samples) of the default tiny model on TextWorld Coin
Collector level 3, with retrieved skills recorded (the self-teacher's privileged context) and the
environment's expert actions (the oracle judge). Every objective prepares its batch from those same
trajectories, so every step runs on the same token ids.

- step: the training loop's own update, ``agentkit.train.update`` (one epoch, one minibatch, one
  process): ``policy_logprobs`` (with the support for ``needs_support``) -> ``objective.loss`` ->
  backward per micro-batch (the loop's token budget), gradient clipping, AdamW step. The NLL step
  is the reference: the same micro-batching and clipping with a token-mean ``F.cross_entropy``
  over the response tokens. Each objective step is timed right after an NLL
  step, from the same weights and optimizer state, in repeated interleaved rounds; the ratio is the
  median of the per-round ratios.
- prepare: ``objective.prepare`` (teacher scoring and turn judgments included) and, for objectives
  with a reference KL, the frozen reference's forward pass, timed apart from the step; the teacher's
  ``score`` and the judges are also timed on their own.
- peak RSS: a fresh subprocess per measurement loads the model, the prepared batch and the
  optimizer, resets the kernel's RSS high-water mark (``/proc/self/clear_refs``, Linux) and reads
  it (``VmHWM`` in ``/proc/self/status``; ``getrusage``'s ru_maxrss also keeps the peak of exited
  threads, which the reset does not clear) before and after one step (its first: a second
  step reuses the allocator's freed pools and shows no growth): "peak" is the process's peak during
  the step, "step adds" what the step needed above the resting process (AdamW's state included,
  2 x the parameters). tracemalloc does not see torch's CPU allocations.

    python benchmarks/train_step.py --rounds 7
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import fields
from datetime import date
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# (row label, objective name, objective args, teacher: None | "self" | "model")
OBJECTIVES = [
    ("sft", "sft", {}, None),
    ("grpo", "grpo", {}, None),
    ("skill_grpo", "skill_grpo", {}, None),
    ("opd", "opd", {}, "model"),
    ("opd (full, top-k 0)", "opd", {"estimator": "full", "topk": 0}, "model"),
    ("opsd", "opsd", {}, "self"),
    ("opsd_rkl", "opsd_rkl", {}, "self"),
    ("grpo_opsd", "grpo_opsd", {}, "self"),
    ("grpo_opsd_rkl", "grpo_opsd_rkl", {}, "self"),
    ("sdar", "sdar", {}, "self"),
    ("rlsd", "rlsd", {}, "self"),
    ("skill_sd", "skill_sd", {}, "self"),
    ("sage_opd (oracle judge)", "sage_opd", {"judge": "oracle"}, "model"),
]


def collect(model_dir: Path, out: Path, tasks: int, group: int, level: int, max_turns: int, seed: int) -> None:
    """Play tasks x group episodes the way ``agentkit.train`` does (skills retrieved for the teacher)."""
    from agentkit.rollout import EpisodeSpec
    from agentkit.rollout.hf_backend import HFBackend
    from agentkit.rollout.run import make_collector, make_envs, resolve_env, sampling_params
    from agentkit.skillbank import SkillBank, SkillSelector, make_retriever, resolve_bank

    from agentkit.core.jsonl import TrajectoryWriter
    from agentkit.core.settings import ContextSettings, EnvSettings, SamplingSettings

    env = resolve_env(EnvSettings(id="textworld/coin-v0", kwargs={"level": level}, max_turns=max_turns))
    bank = SkillBank.load(resolve_bank("textworld"))
    selector = SkillSelector(bank, make_retriever("ucb"), 3, env_id=env.id, seed=seed, show_policy=False)
    collector = make_collector(HFBackend(model_dir, seed=seed), make_envs(env, "train"), env=env, split="train",
                               sampling=sampling_params(SamplingSettings(temperature=1.0, max_new_tokens=24), seed),
                               context=ContextSettings(), skills=selector)
    try:
        with TrajectoryWriter(out, mode="overwrite") as writer:
            collector.run([EpisodeSpec(task, k) for task in range(tasks) for k in range(group)], writer.write)
    finally:
        collector.close()


def load_policy(model_dir: Path):
    from agentkit.rollout.hf_backend import load_causal_lm

    return load_causal_lm(model_dir)


def build(name: str, args: dict, teacher_kind: str | None, policy, tokenizer, teacher_dir: Path):
    """(objective, teacher, judge) as the training loop builds them (``agentkit.train.scoring``)."""
    from agentkit.objectives import make_objective
    from agentkit.skillbank import SkillBank, resolve_bank

    from agentkit.train.scoring import build_teacher_and_judge

    objective = make_objective(name, args)
    spec = {"self": "self", "model": f"model:{teacher_dir}"}.get(teacher_kind or "")
    bank = SkillBank.load(resolve_bank("textworld")) if teacher_kind == "self" else None
    teacher, judge = build_teacher_and_judge(objective.requirements(), teacher_spec=spec, policy=policy,
                                             tokenizer=tokenizer, bank=bank,
                                             privileged=["skills"] if teacher_kind == "self" else None, objective=name)
    return objective, teacher, judge


def prepare(objective, teacher, judge, trajectories, policy, model_dir: Path):
    """The batch an objective trains on (teacher scores and judgments as the loop computes them),
    with the reference's logprobs if it asks for them."""
    from dataclasses import replace

    import torch
    from agentkit.objectives import policy_logprobs

    from agentkit.train.scoring import score_step

    started = time.perf_counter()
    batch = objective.prepare(trajectories, score_step(objective.requirements(), teacher, judge, trajectories))
    prepare_s = time.perf_counter() - started
    ref_s = 0.0
    if objective.requirements().needs_reference:
        reference = load_policy(model_dir)
        reference.requires_grad_(False)
        started = time.perf_counter()
        with torch.no_grad():
            batch = replace(batch, ref_logprobs=policy_logprobs(reference, batch))
        ref_s = time.perf_counter() - started
    return batch, prepare_s, ref_s


def nll_step(model, optimizer, batch, micro_batch_tokens: int, *, all_columns: bool = False) -> float:
    """Token-mean cross-entropy on the response tokens; the loop's micro-batching and clipping.

    The output layer runs only at the columns where some row has a response token, as in
    ``policy_logprobs``; ``all_columns`` runs it at every position (what the loop did before).
    """
    import torch
    import torch.nn.functional as F

    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for micro in batch.micro_batches(micro_batch_tokens):
        L = micro.response_mask.shape[1]
        cols = torch.arange(L) if all_columns else micro.response_mask.any(dim=0).nonzero().squeeze(1)  # [C]
        logits = model(input_ids=micro.input_ids, attention_mask=micro.attention_mask,
                       logits_to_keep=cols).logits.float()  # [B, C, V]
        nll = F.cross_entropy(logits.flatten(0, 1), micro.input_ids[:, cols + 1].flatten(), reduction="none")  # [B*C]
        loss = (nll.view(-1, cols.numel()) * micro.response_mask[:, cols]).sum() / micro.token_normalizer
        loss.backward()
        total += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return total


def loop_update(objective, micro_batch_tokens: int, seed: int = 0):
    """The training loop's update (``agentkit.train.update``) as the loop calls it for one step of
    ``objective``, with one epoch and one minibatch in one process: ``step(model, optimizer, batch)``.
    Its settings are built here, once, outside the timed region."""
    import random

    from agentkit.train.config import TrainSection
    from agentkit.train.distributed import ranks
    from agentkit.train.update import update

    settings = TrainSection(epochs=1, minibatches=1, micro_batch_tokens=micro_batch_tokens, grad_clip=1.0)
    one_process, rng, needs_support = ranks(), random.Random(seed), objective.requirements().needs_support

    def step(model, optimizer, batch):
        return update(model, optimizer, objective, batch, train=settings, ranks=one_process, rng=rng,
                      needs_support=needs_support)

    return step


def save_batch(batch, path: Path) -> None:
    """Tensors to safetensors, everything else (None, numbers, metric dicts) to its JSON metadata: no pickle."""
    import torch
    from safetensors.torch import save_file

    tensors, rest = {}, {}
    for f in fields(batch):
        value = getattr(batch, f.name)
        if isinstance(value, torch.Tensor):
            tensors[f.name] = value.detach().clone().contiguous()
        elif isinstance(value, dict) and value and all(isinstance(v, torch.Tensor) for v in value.values()):
            tensors.update({f"{f.name}.{k}": v.detach().clone().contiguous() for k, v in value.items()})
            rest[f.name] = {"tensors": list(value)}
        else:
            rest[f.name] = {"value": value}
    save_file(tensors, str(path), metadata={"rest": json.dumps(rest)})


def load_batch(path: Path):
    from agentkit.objectives import TokenBatch
    from safetensors import safe_open
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    with safe_open(str(path), "pt") as f:
        rest = json.loads(f.metadata()["rest"])
    values = {name: tensor for name, tensor in tensors.items() if "." not in name}
    for name, held in rest.items():
        values[name] = ({k: tensors[f"{name}.{k}"] for k in held["tensors"]} if "tensors" in held else held["value"])
    return TokenBatch(**values)


def vm_hwm_kb() -> int:
    """The kernel's peak resident set size of this process, kB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise OSError("no VmHWM in /proc/self/status: peak RSS needs Linux")


def memory_child(args) -> None:
    """One fresh process: model + batch + optimizer, a warm-up step, then the measured step."""
    import torch

    torch.set_num_threads(args.threads)
    policy = load_policy(Path(args.model))
    optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-4)
    batch = load_batch(Path(args.batch_file))
    if args.child == "nll":
        def step():
            nll_step(policy, optimizer, batch, args.micro_batch_tokens)
    else:
        from agentkit.objectives import make_objective

        update_step = loop_update(make_objective(args.child, json.loads(args.child_args)), args.micro_batch_tokens)

        def step():
            update_step(policy, optimizer, batch)
    policy.train()
    import gc

    gc.collect()
    # the first step in this process: freed tensors stay in the allocator's pools afterwards, so
    # a second step would reuse them and show no growth. The peak so far is the imports' and
    # loading's; reset the kernel's high-water mark to the current RSS (Linux >= 4.0) so that
    # VmHWM after the step is the step's own peak. (ru_maxrss reads the same counter but also keeps
    # the peak of threads that have exited, which the reset does not clear.)
    Path("/proc/self/clear_refs").write_text("5")
    before = vm_hwm_kb()
    step()
    after = vm_hwm_kb()
    print(json.dumps({"before_kb": before, "after_kb": after}))


def peak_rss(args, batch_file: Path, name: str, objective_args: dict) -> tuple[float, float]:
    """(peak RSS MB of the whole process, MB the measured step added to it)."""
    out = subprocess.run([sys.executable, __file__, "--child", name, "--child-args", json.dumps(objective_args),
                          "--batch-file", str(batch_file), "--model", str(args.model), "--threads", str(args.threads),
                          "--micro-batch-tokens", str(args.micro_batch_tokens)],
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["after_kb"] / 1024, (result["after_kb"] - result["before_kb"]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="Policy folder (default: the shipped tiny model).")
    parser.add_argument("--teacher-model", default=None, help="The separate model teacher (default: a second copy "
                                                              "of --model, loaded as its own module).")
    parser.add_argument("--trajectories", default=None, help="Reuse a JSONL of trajectories instead of collecting.")
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--level", type=int, default=3)
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--micro-batch-tokens", type=int, default=16384, help="train.micro_batch_tokens.")
    parser.add_argument("--rounds", type=int, default=7, help="Interleaved NLL/objective rounds per objective.")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (both sides).")
    parser.add_argument("--only", nargs="*", default=None, help="Objective rows to run (labels' first word).")
    parser.add_argument("--no-llm-judge", action="store_true", help="Skip timing sage_opd's LLM judge.")
    parser.add_argument("--no-memory", action="store_true", help="Skip the peak-RSS subprocesses.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="Also write the figures here.")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-args", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--batch-file", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        memory_child(args)
        return

    import torch
    from agentkit.rollout.hf_backend import load_tokenizer
    from transformers.utils import logging as hf_logging

    from agentkit.core.jsonl import read_trajectories
    from agentkit.models import ensure_default_model

    hf_logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    args.model = Path(args.model) if args.model else ensure_default_model()
    teacher_dir = Path(args.teacher_model) if args.teacher_model else args.model
    work = Path(tempfile.mkdtemp(prefix="train-step-"))
    if args.trajectories:
        path = Path(args.trajectories)
    else:
        path = work / "trajectories.jsonl"
        started = time.perf_counter()
        collect(args.model, path, args.tasks, args.group, args.level, args.max_turns, args.seed)
        print(f"collected {args.tasks * args.group} episodes in {time.perf_counter() - started:.1f}s", file=sys.stderr)
    trajectories = read_trajectories(path)
    tokenizer = load_tokenizer(args.model)
    policy = load_policy(args.model)
    policy.train()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-4)
    rows = [r for r in OBJECTIVES if args.only is None or r[0].split()[0] in args.only]

    # one step of each kind first: AdamW state exists and kernels are warm before anything is timed
    from agentkit.objectives import build_batch

    plain = build_batch(trajectories)
    nll_step(policy, optimizer, plain, args.micro_batch_tokens)
    weights = copy.deepcopy(policy.state_dict())
    opt_state = copy.deepcopy(optimizer.state_dict())

    def restore():
        policy.load_state_dict(weights)
        optimizer.load_state_dict(opt_state)

    def timed(fn) -> float:
        restore()
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started

    # the loop's output layer at response columns only vs at every position (before that fix)
    every, kept = [], []
    for round_ in range(args.rounds):
        pair = [(every, functools.partial(nll_step, policy, optimizer, plain, args.micro_batch_tokens, all_columns=True)),
                (kept, functools.partial(nll_step, policy, optimizer, plain, args.micro_batch_tokens))]
        for out, fn in (pair[::-1] if round_ % 2 else pair):
            out.append(timed(fn))
    columns = {"all_columns_ms": 1000 * statistics.median(every), "response_columns_ms": 1000 * statistics.median(kept),
               "ratio": statistics.median(a / b for a, b in zip(every, kept, strict=True))}
    print(json.dumps({"nll_output_layer": columns}), file=sys.stderr)

    results = []
    nll_all = []
    for label, name, objective_args, teacher_kind in rows:
        objective, teacher, judge = build(name, objective_args, teacher_kind, policy, tokenizer, teacher_dir)
        restore()
        batch, prepare_s, ref_s = prepare(objective, teacher, judge, trajectories, policy, args.model)
        prepare_runs = [prepare_s]
        for _ in range(1):
            restore()
            prepare_runs.append(prepare(objective, teacher, judge, trajectories, policy, args.model)[1])
        score_s = judge_s = None
        if teacher is not None:
            runs = []
            for _ in range(3):
                started = time.perf_counter()
                teacher.score(batch, trajectories, topk=objective.requirements().topk)
                runs.append(time.perf_counter() - started)
            score_s = statistics.median(runs)
        if judge is not None:
            runs = []
            for _ in range(3):
                started = time.perf_counter()
                judge.judge(trajectories)
                runs.append(time.perf_counter() - started)
            judge_s = statistics.median(runs)
        update_step = loop_update(objective, args.micro_batch_tokens, args.seed)
        update_step(policy, optimizer, batch)  # warm-up
        nll_times, obj_times, ratios = [], [], []
        for round_ in range(args.rounds):
            pair = [("nll", functools.partial(nll_step, policy, optimizer, batch, args.micro_batch_tokens)),
                    ("obj", functools.partial(update_step, policy, optimizer, batch))]
            if round_ % 2:
                pair.reverse()  # alternate which side runs first
            got = {kind: timed(fn) for kind, fn in pair}
            nll_times.append(got["nll"])
            obj_times.append(got["obj"])
            ratios.append(got["obj"] / got["nll"])
        nll_all += nll_times
        row = {"objective": label, "name": name, "args": objective_args, "teacher": teacher_kind,
               "step_ms": 1000 * statistics.median(obj_times), "nll_ms": 1000 * statistics.median(nll_times),
               "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
               "prepare_ms": 1000 * statistics.median(prepare_runs), "ref_ms": 1000 * ref_s,
               "score_ms": None if score_s is None else 1000 * score_s,
               "judge_ms": None if judge_s is None else 1000 * judge_s,
               "micro_batches": len(batch.micro_batches(args.micro_batch_tokens)),
               "rows": batch.num_rows, "width": int(batch.input_ids.shape[1]),
               "response_tokens": batch.num_response_tokens}
        if not args.no_memory:
            batch_file = work / "batch.safetensors"
            save_batch(batch, batch_file)
            nll_peak, nll_delta = peak_rss(args, batch_file, "nll", {})
            peak, delta = peak_rss(args, batch_file, name, objective_args)
            row.update(nll_peak_mb=nll_peak, nll_step_mb=nll_delta, peak_mb=peak, step_mb=delta)
        results.append(row)
        print(json.dumps(row), file=sys.stderr)

    llm_judge_ms = None
    if not args.no_llm_judge and any(r[1] == "sage_opd" for r in rows):
        _, _, judge = build("sage_opd", {"judge": "teacher"}, "model", policy, tokenizer, teacher_dir)
        runs = []
        for _ in range(3):
            started = time.perf_counter()
            judgments = judge.judge(trajectories)
            runs.append(time.perf_counter() - started)
        llm_judge_ms = 1000 * statistics.median(runs)
        print(f"LLM judge: {judgments.asked} turns asked", file=sys.stderr)

    nll_ms = 1000 * statistics.median(nll_all)
    first = results[0]
    print(f"\n{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {args.threads} threads; "
          f"{date.today()}; {len(trajectories)} episodes -> {first['rows']} rows x {first['width']} tokens, "
          f"{first['response_tokens']} response tokens, {first['micro_batches']} micro-batch(es) of <= "
          f"{args.micro_batch_tokens} tokens; {args.rounds} interleaved rounds per objective.\n")
    print(f"NLL step: {nll_ms:.1f} ms (median of all rounds)\n")
    print(f"NLL step with the output layer at every position: {columns['all_columns_ms']:.1f} ms vs at the response "
          f"columns only: {columns['response_columns_ms']:.1f} ms ({columns['ratio']:.2f}x, median of per-round ratios)\n")
    print("| objective | step ms | ratio to NLL (min-max) | prepare ms (teacher score / judge / ref) | "
          "prepare / NLL step | peak RSS MB (step adds) | NLL peak RSS MB (step adds) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        parts = [f"score {r['score_ms']:.0f}" if r["score_ms"] is not None else None,
                 f"judge {r['judge_ms']:.1f}" if r["judge_ms"] is not None else None,
                 f"ref {r['ref_ms']:.0f}" if r["ref_ms"] else None]
        detail = " / ".join(p for p in parts if p)
        mem = (f"{r['peak_mb']:.0f} (+{r['step_mb']:.0f})", f"{r['nll_peak_mb']:.0f} (+{r['nll_step_mb']:.0f})") \
            if "peak_mb" in r else ("-", "-")
        print(f"| {r['objective']} | {r['step_ms']:.1f} | **{r['ratio']:.2f}x** ({r['ratio_min']:.2f}-{r['ratio_max']:.2f}) "
              f"| {r['prepare_ms']:.0f}{f' ({detail})' if detail else ''} | {r['prepare_ms'] / r['nll_ms']:.2f}x "
              f"| {mem[0]} | {mem[1]} |")
    if llm_judge_ms is not None:
        print(f"\nsage_opd LLM judge (the teacher's weights, greedy, batched): {llm_judge_ms:.0f} ms "
              f"= {llm_judge_ms / nll_ms:.2f}x the NLL step")
    if args.json:
        Path(args.json).write_text(json.dumps({"nll_ms": nll_ms, "nll_output_layer": columns, "llm_judge_ms": llm_judge_ms, "rows": results}, indent=1))


if __name__ == "__main__":
    main()
