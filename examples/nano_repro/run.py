"""Do the seeds' claims hold at nano scale? Every objective from one SFT'd tiny policy, on a CPU.

    python examples/nano_repro/run.py --out runs/nano-repro                 # the grid, ~1 h on 2 cores
    python examples/nano_repro/run.py --out /tmp/nano-quick --quick         # every stage on tiny budgets (CI)
    python examples/nano_repro/run.py --out runs/nano-repro --envs textworld --only grpo sdar-random --seeds 0

The claims under test (``/work/shared/METHODS.md``): (1) SDAR beats GRPO, also with random skill
retrieval, because its gate filters unhelpful guidance; GRPO+OPSD is unstable and pure OPSD
collapses on small models. (2) SAGE-OPD beats OPD, and OPD saturates early while SAGE-OPD keeps
improving.

For each environment (``ENVS``), in ``OUT/ENV/``:

1. ``model-init/``   the tiny model (``agentkit model init --size tiny --seed 0``).
2. ``demos.jsonl``   expert demonstrations on training games far from the games RL trains on:
                     ``plain`` episodes exactly as the collector would show them, and ``hinted``
                     episodes on other games whose token stream starts with the privileged block
                     *exactly as the self-teacher renders it* (``teachers.context``: retrieved skills
                     and the environment's expert plan as a system message before the student's
                     ids; in window mode before every turn's prompt, as the teacher scores them).
                     The expert follows the plan, so SFT teaches the policy to read the block and
                     act on it, as an LLM would in context. The block must carry something the
                     student's prompt does not: on TextWorld the coin collector's instruction, which
                     spells out the route, is hidden (``goal=brief``) and distractor rooms are on
                     (level 103), so only the plan knows the way; ALFWorld's plan says where the
                     object is. ``stages.json``'s ``hint_use`` measures what the block is worth to
                     the SFT policy on held-out expert games: log-prob of the expert's tokens, share
                     of them that are its top-1, and share of whole actions that are its greedy
                     choice, without and with the block.
3. ``sft/``          SFT on all demonstrations: the shared initial policy of every RL run. Frozen
                     and shown the privileged block, it is also OPD's and SAGE-OPD's teacher: a
                     stronger player than the student because it knows the plan (a separate model
                     trained on the same games without the block was tried and is hardly better than
                     the student: 18.8% vs 15.6% on TextWorld, no headroom for distillation).
4. ``runs/VARIANT/seed-S/``  one RL run per objective variant (``VARIANTS``) and seed, all from
                     ``sft/``'s last checkpoint with the same rollout budget (steps x tasks x group),
                     evaluated during training on the curve split and, after it, greedily on every
                     eval split (``result.json``).

Then ``OUT/results.json``, and the report ``--report`` (default ``OUT/nano_repro.md``) with PNG
curves next to it. A stage whose output exists is skipped and a training run resumes from its last
checkpoint, so the same command continues an interrupted grid; a grid that is only partly done
still gets a report of what finished (rows say how many seeds they average).

Departures, on purpose: SAGE-OPD's judge is the ``oracle`` (the environment's expert action)
because a tiny teacher cannot write a label (every answer would be unparseable, hence Strong);
objective settings are the objectives' defaults (the papers' reference values), not tuned here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentkit.core import runs

PRIVILEGED = ("skills", "env")  # what the self-teacher sees, and what the hinted demonstrations show


@dataclasses.dataclass(frozen=True)
class EnvSetup:
    """One environment of the grid and its budgets."""

    env_id: str
    kwargs: dict[str, Any]
    eval_splits: tuple[str, ...]  # the first is the one evaluated during training (the curves)
    max_turns: int
    max_new_tokens: int
    plain_demos: int  # few on purpose: SFT alone must leave room for RL
    hinted_demos: int
    sft_steps: int
    rl_steps: int
    tasks_per_step: int
    group_size: int
    eval_every: int
    eval_episodes: int  # per eval split, at the end of a run
    curve_episodes: int  # during training
    context: str = "chat"  # context.mode: "chat" (whole history) or "window" (the last `window` turns)
    window: int = 3


ENVS: dict[str, EnvSetup] = {
    # quest length 3 with distractor rooms, and the instruction that spells out the route replaced by
    # "Find the coin and take it.": the privileged expert plan knows the way, the student has to find it
    "textworld": EnvSetup("textworld/coin-v0", {"level": 103, "goal": "brief"}, ("eval",), max_turns=8,
                          max_new_tokens=16, plain_demos=32, hinted_demos=160, sft_steps=600, rl_steps=16,
                          tasks_per_step=4, group_size=4, eval_every=4, eval_episodes=32, curve_episodes=16),
    # window context (the last 2 turns): shorter prompts than the whole history, and the tiny policy
    # matches more whole expert actions with them (15% vs 4% of held-out expert turns, same demos)
    "alfworld": EnvSetup("alfworld/alfworld-v0", {"task_types": "pick_and_place"}, ("eval_out", "eval_in"),
                         max_turns=8, max_new_tokens=24, plain_demos=64, hinted_demos=64,
                         sft_steps=400, rl_steps=8, tasks_per_step=2, group_size=4, eval_every=4,
                         eval_episodes=16, curve_episodes=8, context="window", window=2),
}
QUICK = dict(plain_demos=2, hinted_demos=2, sft_steps=2, rl_steps=1,
             tasks_per_step=1, group_size=2, eval_every=1, eval_episodes=1, curve_episodes=1, max_turns=3,
             max_new_tokens=8)
DEMO_FIRST_SEED = 100_000  # far from RL's training games 0 .. steps * tasks_per_step - 1

# objective variant -> overrides; "{sft}" is the SFT policy's checkpoint (frozen: OPD's teacher)
_SELF = [f"teacher.privileged=[{', '.join(PRIVILEGED)}]"]
_PENALTY = ["objective.args.invalid_action_penalty=0.1"]
VARIANTS: dict[str, list[str]] = {
    "grpo": ["objective.name=grpo", *_PENALTY],
    "grpo_opsd": ["objective.name=grpo_opsd", *_PENALTY, *_SELF],
    "opsd": ["objective.name=opsd", *_SELF],
    "skill_sd": ["objective.name=skill_sd", *_PENALTY, *_SELF],
    "rlsd": ["objective.name=rlsd", *_PENALTY, *_SELF],
    **{f"sdar-{r}": ["objective.name=sdar", *_PENALTY, *_SELF, f"skills.retrieval={r}"]
       for r in ("ucb", "keyword", "full", "random")},
    "opd": ["objective.name=opd", "teacher.spec=model:{sft}", *_SELF],
    "sage_opd": ["objective.name=sage_opd", "teacher.spec=model:{sft}", *_SELF, "objective.args.judge=oracle"],
}
DIAGNOSTICS = ("gate_mean", "gate_above_half", "gap_mean", "negative_gap_share", "reverse_kl", "judge_skip_share",
               "judge_weak_share", "judge_strong_share", "judge_check_share", "confidence_mean", "Z")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/nano-repro", help="Folder for everything the grid writes.")
    parser.add_argument("--report", default=None, help="Markdown report (default OUT/nano_repro.md); PNGs beside it.")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="RL seeds (the SFT policy is shared).")
    parser.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS), help="Environments.")
    parser.add_argument("--only", nargs="+", default=list(VARIANTS), choices=list(VARIANTS), metavar="VARIANT",
                        help=f"Objective variants: {', '.join(VARIANTS)}.")
    parser.add_argument("--jobs", type=int, default=2, help="RL runs at a time (one thread each); 0: one after another in this process.")
    parser.add_argument("--quick", action="store_true", help="Tiny budgets: checks that every stage runs, learns nothing.")
    parser.add_argument("--report-only", action="store_true", help="Write the report from what has finished; train nothing.")
    parser.add_argument("--run-one", nargs=3, metavar=("ENV", "VARIANT", "SEED"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def setup_for(name: str, quick: bool) -> EnvSetup:
    setup = ENVS[name]
    return dataclasses.replace(setup, **QUICK) if quick else setup


def quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


# ---------------------------------------------------------------- configs


def base_overrides(setup: EnvSetup) -> list[str]:
    return [f"env.id={setup.env_id}", f"env.kwargs={json.dumps(setup.kwargs)}", f"eval.split={setup.eval_splits[0]}",
            f"env.max_turns={setup.max_turns}", f"sampling.max_new_tokens={setup.max_new_tokens}",
            f"context.mode={setup.context}", f"context.window={setup.window}", "checkpoint.keep=1"]


def sft_config(setup: EnvSetup, *, model: Path, demos: Path, out: Path, steps: int):
    from agentkit.train.config import load_config

    return load_config(None, [*base_overrides(setup), "objective.name=sft", "train.lr=2e-3", "train.demos_per_step=16",
                              f"train.steps={steps}", "eval.every=0", f"eval.episodes={setup.curve_episodes}",
                              f"checkpoint.every={steps}", "seed=0", f"model={model}", f"train.demos={demos}",
                              f"out={out}"])


def rl_config(setup: EnvSetup, variant: str, seed: int, *, model: Path, out: Path):
    from agentkit.train.config import load_config

    overrides = [o.replace("{sft}", str(model)) for o in VARIANTS[variant]]
    return load_config(None, [*base_overrides(setup), *overrides, "train.lr=2e-4", f"train.steps={setup.rl_steps}",
                              f"rollout.tasks_per_step={setup.tasks_per_step}", f"rollout.group_size={setup.group_size}",
                              "sampling.temperature=1.0", f"eval.every={setup.eval_every}",
                              f"eval.episodes={setup.curve_episodes}", f"checkpoint.every={setup.eval_every}",
                              f"seed={seed}", f"model={model}", f"out={out}"])


def final_checkpoint(run_dir: Path, steps: int) -> Path:
    return runs.checkpoint_dir(run_dir, steps)


def run_training(cfg) -> bool:
    """Train, or resume a run that stopped; a finished run is left as it is (returns False)."""
    from agentkit.train import train
    from agentkit.train.checkpoint import checkpoints

    run_dir = Path(cfg.out)
    done = checkpoints(run_dir)
    if done and done[-1] >= cfg.train.steps:
        return False
    # a run stopped before its first checkpoint is played again from step 0 by --resume
    train(cfg, resume=(run_dir / "config.yaml").exists(), show_progress=False)
    return True


# ---------------------------------------------------------------- demonstrations


def hinted(trajectory, tokenizer, bank, rng: random.Random, k: int = 3):
    """The episode as a self-teacher would see it: the privileged block (``k`` skills drawn at
    random, as a retriever might, and the expert plan) in front of the student's first context."""
    from agentkit.teachers.context import prefix_ids, privileged_text

    skills = [s.id for s in rng.sample(list(bank), min(k, len(bank)))]
    with_skills = dataclasses.replace(trajectory, skills=skills)
    block = prefix_ids(tokenizer, privileged_text(with_skills, PRIVILEGED, bank))
    if trajectory.context_mode == "window":  # every turn is a prompt of its own: the teacher prefixes each
        turns = [dataclasses.replace(t, context_ids=block + t.context_ids) for t in trajectory.turns]
    else:  # one growing sequence: the block once, in front of it
        turns = [dataclasses.replace(trajectory.turns[0], context_ids=block + trajectory.turns[0].context_ids),
                 *trajectory.turns[1:]]
    return dataclasses.replace(with_skills, turns=turns, id=trajectory.id + "|hinted")


def expert_games(setup: EnvSetup, tokenizer, *, split: str, seeds: Sequence[int]) -> list:
    """Won expert episodes on ``seeds`` of ``split``, recorded as the collector would."""
    from agentkit.rollout.demos import play_demonstration
    from agentkit.rollout.run import env_factory

    env = env_factory(setup.env_id, split=split, max_turns=50, env_kwargs=setup.kwargs)()
    try:
        games = [play_demonstration(env, tokenizer, env_id=setup.env_id, seed=s, split=split, model="expert",
                                    context=setup.context, window=setup.window) for s in seeds]
    finally:
        env.close()
    return [g for g in games if g.won and g.privileged]


def write_demos(setup: EnvSetup, model_dir: Path, env_dir: Path) -> None:
    from agentkit.rollout.hf_backend import load_tokenizer
    from agentkit.skillbank import SkillBank, default_bank_for, resolve_bank

    from agentkit.core.jsonl import TrajectoryWriter

    tokenizer = load_tokenizer(model_dir)
    bank = SkillBank.load(resolve_bank(default_bank_for(setup.env_id)))
    n = setup.plain_demos + setup.hinted_demos
    games = expert_games(setup, tokenizer, split="train", seeds=range(DEMO_FIRST_SEED, DEMO_FIRST_SEED + n))
    rng = random.Random(0)
    demos = games[: setup.plain_demos] + [hinted(g, tokenizer, bank, rng) for g in games[setup.plain_demos:]]
    partial = env_dir / "demos.partial"
    with TrajectoryWriter(partial, mode="overwrite") as writer:
        for row in demos:
            writer.write(row)
    partial.rename(env_dir / "demos.jsonl")


def hint_use(setup: EnvSetup, policy_dir: Path, episodes: int) -> dict[str, float]:
    """What the privileged block is worth to a policy on held-out expert games: the mean log-prob
    of the expert's tokens and the share of them that are the policy's top-1, without and with it."""
    import torch
    from agentkit.objectives.batch import build_batch
    from agentkit.rollout.hf_backend import load_tokenizer
    from agentkit.skillbank import SkillBank, default_bank_for, resolve_bank
    from agentkit.teachers.model import ModelTeacher
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(policy_dir)
    model = AutoModelForCausalLM.from_pretrained(policy_dir).eval()
    bank = SkillBank.load(resolve_bank(default_bank_for(setup.env_id)))
    games = expert_games(setup, tokenizer, split=setup.eval_splits[0], seeds=range(episodes))
    rng = random.Random(0)
    games = [dataclasses.replace(g, skills=[s.id for s in rng.sample(list(bank), min(3, len(bank)))]) for g in games]
    batch = build_batch(games)
    out: dict[str, float] = {"episodes": len(games)}
    for label, privileged in (("without", ()), ("with", PRIVILEGED)):
        with torch.no_grad():
            scores = ModelTeacher(model, tokenizer, name=label, privileged=privileged, bank=bank).score(batch, games)
        mask = batch.response_mask.bool()
        is_top1 = scores.logprobs >= scores.top1 - 1e-6  # [N, T]
        out[f"logprob_{label}"] = float(scores.logprobs[mask].mean())
        out[f"top1_{label}"] = float(is_top1[mask].float().mean())
        # a turn's whole action is the policy's greedy choice: every response token of the turn is top-1
        turn_keys = batch.episode_index[:, None] * (int(batch.turn_index.max()) + 1) + batch.turn_index  # [N, T]
        keys = turn_keys[mask].unique()
        greedy = [bool(is_top1[mask & (turn_keys == key)].all()) for key in keys]
        out[f"action_top1_{label}"] = sum(greedy) / max(len(greedy), 1)
    return out


# ---------------------------------------------------------------- evaluation


def evaluate_splits(setup: EnvSetup, cfg, policy_dir: Path) -> dict[str, dict[str, float]]:
    """Greedy episodes on seeds 0 .. eval_episodes-1 of every eval split, as the training loop evaluates."""
    from agentkit.rollout.collector import EpisodeSpec
    from agentkit.rollout.hf_backend import HFBackend
    from agentkit.rollout.run import make_collector, make_envs, resolve_env, sampling_params

    from agentkit.core.settings import GenerationSettings

    backend = HFBackend(policy_dir, seed=cfg.seed)
    env = resolve_env(cfg.env)
    greedy = sampling_params(GenerationSettings(max_new_tokens=cfg.sampling.max_new_tokens), 0)
    results = {}
    for split in setup.eval_splits:
        envs = make_envs(env, split)
        episodes: list = []
        try:
            collector = make_collector(backend, envs, env=env, split=split, sampling=greedy, context=cfg.context)
            collector.run([EpisodeSpec(seed) for seed in range(setup.eval_episodes)], episodes.append)
        finally:
            envs.close()
        won = [e for e in episodes if e.won]
        results[split] = {"success_rate": len(won) / max(len(episodes), 1), "episodes": len(episodes),
                          "turns_per_solved": statistics.fmean(len(e.turns) for e in won) if won else None,
                          "invalid_rate": (sum(not t.action_valid for e in episodes for t in e.turns)
                                           / max(sum(len(e.turns) for e in episodes), 1))}
    return results


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------- stages


def prepare_env(name: str, setup: EnvSetup, out: Path) -> dict[str, Any]:
    """Model, demonstrations, SFT policy and their evaluations (each cached)."""
    from agentkit.models import init_model

    env_dir = out / name
    env_dir.mkdir(parents=True, exist_ok=True)
    times_file = env_dir / "prep_times.json"  # seconds of each stage, recorded by the invocation that ran it
    wall: dict[str, float] = json.loads(times_file.read_text()) if times_file.exists() else {}
    started = time.perf_counter()
    model_init = env_dir / "model-init"
    if not (model_init / "config.json").exists():
        import shutil

        shutil.rmtree(model_init, ignore_errors=True)
        init_model(model_init, size="tiny", seed=0)
    if not (env_dir / "demos.jsonl").exists():
        write_demos(setup, model_init, env_dir)
        wall["demos"] = time.perf_counter() - started
    started = time.perf_counter()
    sft = sft_config(setup, model=model_init, demos=env_dir / "demos.jsonl", out=env_dir / "sft", steps=setup.sft_steps)
    if run_training(sft):
        wall["sft"] = time.perf_counter() - started
    started = time.perf_counter()
    stage_file = env_dir / "stages.json"
    if not stage_file.exists():
        sft_dir = final_checkpoint(env_dir / "sft", setup.sft_steps)
        stages = {"init": evaluate_splits(setup, sft, model_init), "sft": evaluate_splits(setup, sft, sft_dir),
                  "hint_use": hint_use(setup, sft_dir, setup.eval_episodes)}
        stage_file.write_text(json.dumps(stages, indent=1))
        wall["stage_eval"] = time.perf_counter() - started
    times_file.write_text(json.dumps(wall, indent=1))
    return {**json.loads(stage_file.read_text()), "prep_wall_s": wall}


def run_one(name: str, variant: str, seed: int, out: Path, quick: bool) -> None:
    """One RL run and its final evaluation, written to ``result.json`` (skipped when it exists)."""
    setup = setup_for(name, quick)
    env_dir = out / name
    run_dir = env_dir / "runs" / variant / f"seed-{seed}"
    result_file = run_dir / "result.json"
    if result_file.exists():
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = run_dir / "running.pid"  # two grids on one --out (e.g. one per env) never train the same run
    if lock.exists() and _alive(int(lock.read_text() or 0)):
        print(f"{run_dir} is being trained by process {lock.read_text()}; skipped here.")
        return
    lock.write_text(str(os.getpid()))
    try:
        _train_and_evaluate(setup, name, variant, seed, env_dir, run_dir, result_file)
    finally:
        lock.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return pid > 0


def _train_and_evaluate(setup: EnvSetup, name: str, variant: str, seed: int, env_dir: Path, run_dir: Path,
                        result_file: Path) -> None:
    started = time.perf_counter()
    cfg = rl_config(setup, variant, seed, model=final_checkpoint(env_dir / "sft", setup.sft_steps),
                    out=run_dir / "train")
    run_training(cfg)
    train_s = time.perf_counter() - started
    evals = evaluate_splits(setup, cfg, final_checkpoint(run_dir / "train", setup.rl_steps))
    metrics = read_jsonl(runs.metrics_file(run_dir / "train"))
    result = {
        "env": name, "variant": variant, "seed": seed, "eval": evals,
        "curve": [{"step": r["step"], "success_rate": r["success_rate"]}
                  for r in read_jsonl(runs.eval_file(run_dir / "train"))],
        "diagnostics": {k: statistics.fmean(m[k] for m in metrics if k in m)
                        for k in DIAGNOSTICS if any(k in m for m in metrics)},
        "rollout_episodes": setup.rl_steps * setup.tasks_per_step * setup.group_size,
        "train_s": train_s, "wall_s": time.perf_counter() - started,
    }
    result_file.write_text(json.dumps(result, indent=1))


def run_processes(commands: dict[str, tuple[list[str], Path]], jobs: int) -> list[str]:
    """Run each ``name -> (command, log file)`` in its own one-thread process, ``jobs`` at a time,
    its output in its log; say when each ends; return the names that failed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    pending, running, failed = list(commands), [], []
    while pending or running:
        while pending and len(running) < jobs:
            name = pending.pop(0)
            command, log = commands[name]
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "w") as handle:
                running.append((subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env), name))
            print(f"started {name}", flush=True)
        time.sleep(0.5)
        for proc, name in list(running):
            if proc.poll() is not None:
                running.remove((proc, name))
                print(f"{'finished' if proc.returncode == 0 else f'FAILED (see {commands[name][1]})'} {name}", flush=True)
                if proc.returncode != 0:
                    failed.append(name)
    if failed:
        print(f"{len(failed)} run(s) failed: {failed}", flush=True)
    return failed


def run_grid(args: argparse.Namespace, out: Path) -> None:
    """Every (env, variant, seed) not done yet, ``--jobs`` at a time, each in its own one-thread process."""
    # seed-major: a grid cut short has every cell with fewer seeds rather than some cells empty
    pending = [(e, v, s) for s in args.seeds for e in args.envs for v in args.only
               if not (out / e / "runs" / v / f"seed-{s}" / "result.json").exists()]
    if args.jobs == 0:  # one after another in this process: no interpreter start-up per run (the quick test)
        for name, variant, seed in pending:
            run_one(name, variant, seed, out, args.quick)
            print(f"finished {name} {variant} seed {seed}", flush=True)
        return
    run_processes({f"{e} {v} seed {s}": ([sys.executable, __file__, "--out", str(out), "--run-one", e, v, str(s),
                                          *(["--quick"] if args.quick else [])],
                                         out / e / "runs" / v / f"seed-{s}.log") for e, v, s in pending}, args.jobs)


def collect(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    envs = {}
    for name in args.envs:
        setup = setup_for(name, args.quick)
        stage_file = out / name / "stages.json"
        runs = [json.loads(p.read_text()) for p in sorted((out / name / "runs").glob("*/seed-*/result.json"))]
        times_file = out / name / "prep_times.json"
        envs[name] = {"setup": dataclasses.asdict(setup), "stages": json.loads(stage_file.read_text())
                      if stage_file.exists() else None, "runs": runs,
                      "prep_times": json.loads(times_file.read_text()) if times_file.exists() else {}}
    return {"command": " ".join(["examples/nano_repro/run.py", *sys.argv[1:]]), "quick": args.quick,
            "seeds": args.seeds, "variants": args.only, "envs": envs}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet_libraries()
    out = Path(args.out)
    if args.run_one:
        name, variant, seed = args.run_one
        import torch

        torch.set_num_threads(1)
        run_one(name, variant, int(seed), out, args.quick)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if not args.report_only:
        for name in args.envs:
            prepare_env(name, setup_for(name, args.quick), out)
            print(f"{name}: SFT policy ready ({time.perf_counter() - started:.0f} s)", flush=True)
        run_grid(args, out)
    results = collect(args, out)
    results["wall_s"] = time.perf_counter() - started
    (out / "results.json").write_text(json.dumps(results, indent=1))
    from report import write_report  # examples/nano_repro/report.py, beside this script

    report = Path(args.report) if args.report else out / "nano_repro.md"
    write_report(results, report)
    report.with_suffix(".json").write_text(json.dumps(results, indent=1))  # the data behind the report, beside it
    print(f"wrote {out / 'results.json'}, {report} and {report.with_suffix('.json')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
