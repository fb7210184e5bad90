"""The ``agentkit`` command. Thin: parse, build a config, call one library function.

Heavy imports (torch, transformers, textworld) happen inside the commands so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from agentkit.core.errors import AgentkitError, ConfigError


def _parse_kv(pairs: list[str]) -> dict:
    from agentkit.core.config import parse_assignment

    return dict(parse_assignment(pair, flag="--env-kwargs", form="key=value", example="level=10") for pair in pairs)


def _quiet_hf() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


# -- rollout ----------------------------------------------------------------------------------
def cmd_rollout(args: argparse.Namespace) -> int:
    from agentkit.core.config import build_config
    from agentkit.rollout.config import RolloutConfig

    values = {k: v for k, v in vars(args).items() if k in RolloutConfig.model_fields}
    values["env_kwargs"] = _parse_kv(args.env_kwargs or [])
    cfg = build_config(RolloutConfig, values)
    _quiet_hf()
    from rich.console import Console

    from agentkit.models import ensure_default_model
    from agentkit.rollout.run import check_output, default_out_path, run_rollout

    out = Path(cfg.out) if cfg.out else default_out_path()
    check_output(out, append=cfg.append, overwrite=cfg.overwrite, resume=cfg.resume)
    console = Console(stderr=True)
    if cfg.model:
        model_dir = Path(cfg.model)
    else:
        with console.status("Building the default tiny model (first use only)..."):
            model_dir = ensure_default_model()
    from tqdm import tqdm

    bar = tqdm(total=cfg.episodes * cfg.group_size, desc=f"rollout {cfg.env}", unit="ep", disable=args.quiet)

    def progress(trajectory, stats) -> None:
        bar.update(1)
        bar.set_postfix(success=f"{stats.success_rate:.2f}", ret=f"{stats.mean_return:.2f}")

    plans = []

    def on_resume(plan) -> None:
        plans.append(plan)
        bar.reset(total=len(plan.remaining))
        bar.set_description(f"rollout {cfg.env} (resumed, {plan.done} already done)")

    try:
        stats, out = run_rollout(cfg, model_dir, progress=progress, out=out, on_resume=on_resume)
    finally:
        bar.close()
    console = _stdout_console()
    if plans and not plans[0].remaining:
        console.print(f"nothing to resume: {out} already holds all {plans[0].done} trajectories of this command"
                      + _torn_note(plans[0]))
        return 0
    _print_summary(console, cfg.env, stats, out, resumed=plans[0] if plans else None)
    return 0


def _torn_note(plan) -> str:
    return (f" (a torn last line of {plan.torn_bytes} bytes, from the interrupted write, was moved to {plan.torn_path})"
            if plan.torn_bytes else "")


def _stdout_console():
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # logs and pipes get the whole table on one line per row
        console.width = max(console.width, 140)
    return console


def _print_summary(console, env_id: str, stats, out: Path, *, resumed=None) -> None:
    from rich.table import Table

    table = Table(title=f"agentkit rollout: {env_id}")
    for col in ("episodes", "success rate", "mean return", "mean turns", "invalid actions", "tokens/s", "env steps/s"):
        table.add_column(col, justify="right")
    table.add_row(str(stats.episodes), f"{stats.success_rate:.1%}", f"{stats.mean_return:.3f}", f"{stats.mean_turns:.1f}",
                  f"{stats.invalid_rate:.1%}", f"{stats.tokens_per_s:.0f}", f"{stats.env_steps_per_s:.1f}")
    console.print(table)
    note = f" ({stats.errors} ended by errors)" if stats.errors else ""
    if resumed is not None:
        console.print(f"resumed {out}: {resumed.done} trajectories were already there, played and appended "
                      f"{stats.episodes}{note}; it now holds {resumed.done + stats.episodes}" + _torn_note(resumed))
        return
    console.print(f"wrote {stats.episodes} trajectories to {out}{note}")


# -- envs -------------------------------------------------------------------------------------
def cmd_envs_list(args: argparse.Namespace) -> int:
    from rich.table import Table

    from agentkit.envs import status

    table = Table(title="agentkit environments")
    for col in ("id", "status", "description", "from"):
        table.add_column(col)
    for row in status():
        table.add_row(row.id, "installed" if row.available else "[red]unavailable[/red]", row.detail, row.distribution)
    _stdout_console().print(table)
    return 0


def cmd_envs_check(args: argparse.Namespace) -> int:
    import time

    from agentkit.envs import check_env, make, play_expert

    env = make(args.id, **_parse_kv(args.env_kwargs or []))
    try:
        check_env(env, seed=args.seed)
        print(f"{args.id}: check_env passed")
        if "expert_plan" not in env.reset(seed=args.seed)[1]:
            print(f"{args.id}: no info['expert_plan']; no expert to play")
            return 0
        won = 0
        for seed in range(args.seed, args.seed + args.tasks):
            start = time.perf_counter()
            ok, steps = play_expert(env, seed)
            won += ok
            print(f"  task {seed}: expert {'won' if ok else 'LOST'} in {steps} steps ({time.perf_counter() - start:.1f} s)")
    finally:
        env.close()
    print(f"{args.id}: expert won {won}/{args.tasks} tasks")
    return 0 if won == args.tasks else 1


# -- model ------------------------------------------------------------------------------------
def cmd_model_init(args: argparse.Namespace) -> int:
    _quiet_hf()
    from agentkit.models import init_model

    path = init_model(args.out, size=args.size, seed=args.seed, vocab_size=args.vocab_size)
    print(f"wrote a {args.size} model and tokenizer to {path}")
    return 0


# -- training -----------------------------------------------------------------------------------
def cmd_train(args: argparse.Namespace) -> int:
    from agentkit.train_config import describe_config, load_config

    if args.help_config:
        print("Settings (--config YAML sections, or --set KEY=VALUE):\n" + describe_config(args.objective))
        return 0
    cfg = load_config(args.config, args.set, **{
        "objective.name": args.objective, "env.id": args.env, "model": args.model, "out": args.out,
        "train.steps": args.steps, "rollout.group_size": args.group_size,
        "rollout.tasks_per_step": args.tasks_per_step, "train.demos": args.demos, "seed": args.seed,
        "teacher.spec": args.teacher, "skills.bank": args.skills, "skills.retrieval": args.retrieval,
    })
    _quiet_hf()
    from agentkit.train import train

    run_dir = train(cfg, resume=args.resume, show_progress=not args.quiet)
    if os.environ.get("RANK", "0") == "0":  # once, not per training process
        print(f"run folder: {run_dir} (metrics.jsonl, eval.jsonl, checkpoints/, curves.png)")
    return 0


def cmd_demos(args: argparse.Namespace) -> int:
    if args.episodes <= 0:
        raise ConfigError(f"--episodes must be positive, got {args.episodes}.")
    _quiet_hf()
    from agentkit.envs.registry import parses_own_actions
    from agentkit.models import ensure_default_model
    from agentkit.rollout.demos import write_demonstrations
    from agentkit.rollout.hf_backend import load_tokenizer
    from agentkit.rollout.run import check_output, env_factory

    out = Path(args.out)
    check_output(out, append=args.append, overwrite=args.overwrite)
    tokenizer = load_tokenizer(args.model or ensure_default_model())
    make_env = env_factory(args.env, split=args.split, max_turns=args.max_turns, env_kwargs=_parse_kv(args.env_kwargs or []))
    mode = "append" if args.append else "overwrite" if args.overwrite else "new"
    written, lost = write_demonstrations(
        make_env, tokenizer, out, env_id=args.env, seeds=range(args.seed, args.seed + args.episodes), split=args.split,
        mode=mode, context=args.context, parses_actions=parses_own_actions(args.env), model=str(args.model or "expert"))
    print(f"wrote {written} expert demonstrations to {out}" + (f" ({lost} lost episodes skipped)" if lost else ""))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from agentkit.core.config import build_config
    from agentkit.rollout.config import RolloutConfig

    values = {"env": args.env, "model": args.model, "episodes": args.episodes, "split": args.split,
              "max_turns": args.max_turns, "temperature": 0.0, "env_kwargs": _parse_kv(args.env_kwargs or []),
              "env_workers": args.env_workers, "out": args.out, "overwrite": bool(args.out),
              "skills": args.skills, "retrieval": args.retrieval}
    cfg = build_config(RolloutConfig, {k: v for k, v in values.items() if v is not None})
    _quiet_hf()
    import tempfile

    from agentkit.models import ensure_default_model
    from agentkit.rollout.run import run_rollout

    model_dir = Path(cfg.model) if cfg.model else ensure_default_model()
    with tempfile.TemporaryDirectory() as tmp:
        stats, out = run_rollout(cfg, model_dir, out=Path(cfg.out) if cfg.out else Path(tmp) / "eval.jsonl")
        _print_summary(_stdout_console(), f"{cfg.env} ({cfg.split}, greedy)", stats, out)
    return 0


def cmd_objectives_list(args: argparse.Namespace) -> int:
    from agentkit.objectives import describe

    for name, dist, about in describe():
        print(f"{name:12} {about}  [{dist}]")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from agentkit.plots import plot_runs

    for run in args.runs:
        if not (Path(run) / "metrics.jsonl").exists():
            raise ConfigError(f"{run} is not a run folder (no metrics.jsonl).")
    print(f"wrote {plot_runs([Path(r) for r in args.runs], Path(args.out))}")
    return 0


def cmd_view(args: argparse.Namespace) -> int:
    from agentkit.view import write_report

    if args.max_episodes <= 0:
        raise ConfigError(f"--max-episodes must be positive, got {args.max_episodes}.")
    out, episodes = write_report(Path(args.source), Path(args.out), model=args.model, max_episodes=args.max_episodes)
    print(f"wrote {out} ({episodes} episodes); open it in a browser")
    return 0


# -- skills -------------------------------------------------------------------------------------
def _load_bank(name: str):
    from agentkit.skillbank import SkillBank, resolve_bank

    return SkillBank.load(resolve_bank(name))


def cmd_skills_list(args: argparse.Namespace) -> int:
    bank = _load_bank(args.bank)
    print(f"{bank.path}: {len(bank)} skills, {bank.episodes} episodes recorded")
    for s in bank:
        where = ",".join(s.applies_to) or "all"
        print(f"{s.id:26} uses {s.stats.uses:5d}  mean return {s.stats.mean_return:6.3f}  [{where}]  {s.title}")
    return 0


def cmd_skills_retrieve(args: argparse.Namespace) -> int:
    import random

    from agentkit.skillbank import make_retriever

    if args.k <= 0:
        raise ConfigError(f"-k must be positive, got {args.k}.")
    bank = _load_bank(args.bank)
    chosen = make_retriever(args.strategy).retrieve(bank, args.task, args.k, env=args.env, task_type=args.task_type,
                                                    rng=random.Random(args.seed))
    for s in chosen:
        print(f"{s.id}\t{s.title}\t{s.text}")
    if not chosen:
        print("(no skill matched)", file=sys.stderr)
    return 0


def cmd_skills_extract(args: argparse.Namespace) -> int:
    from agentkit.core.jsonl import read_trajectories
    from agentkit.rollout.hf_backend import HFBackend
    from agentkit.skillbank import SkillBank, resolve_bank
    from agentkit.skillbank.extract import extract_skills
    from agentkit.teachers import split_spec

    name, arg = split_spec(args.teacher)
    if name != "model" or not arg:
        raise ConfigError(f"--teacher {args.teacher!r}: extraction needs a model to write skills: --teacher model:DIR.")
    _quiet_hf()
    trajectories = read_trajectories(args.trajectories)
    path = resolve_bank(args.bank)
    bank = SkillBank.load(path) if path.exists() else SkillBank(path=path)
    report = extract_skills(trajectories, bank, HFBackend(arg), max_new_tokens=args.max_new_tokens,
                            dedup_threshold=args.dedup, source=str(args.trajectories))
    if report.added:
        bank.save(path)
    print(f"{report.episodes} won episodes -> {len(report.added)} new skills in {path} "
          f"({report.duplicates} duplicates, {report.empty} empty, {report.unformatted} without TITLE/SKILL lines)")
    for skill_id in report.added:
        print(f"  {skill_id}: {bank.get(skill_id).title}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from agentkit import __version__
    from agentkit.core.config import add_config_arguments
    from agentkit.rollout.config import RolloutConfig

    parser = argparse.ArgumentParser(prog="agentkit", description="Train LLM agents on multi-turn text environments.")
    parser.add_argument("--version", action="version", version=f"agentkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("rollout", help="Play episodes with a policy and write trajectories (JSONL).",
                       description="Play episodes with a policy and write turn-segmented, token-exact trajectories.")
    add_config_arguments(p, RolloutConfig, skip={"env_kwargs"})
    p.add_argument("--env-kwargs", nargs="*", metavar="KEY=VALUE", help="Environment settings, e.g. level=10 rewards=sparse.")
    p.add_argument("--quiet", action="store_true", help="No progress bar.")
    p.set_defaults(func=cmd_rollout)

    envs = sub.add_parser("envs", help="List and check environments.").add_subparsers(dest="envs_command", metavar="SUBCOMMAND")
    p = envs.add_parser("list", help="Every environment and whether it is installed.")
    p.set_defaults(func=cmd_envs_list)
    p = envs.add_parser("check", help="Validate an environment against the protocol.")
    p.add_argument("id", help="Environment id.")
    p.add_argument("--seed", type=int, default=0, help="First task seed to check with.")
    p.add_argument("--tasks", type=int, default=3, help="Tasks on which to play the expert plan (all must be won).")
    p.add_argument("--env-kwargs", nargs="*", metavar="KEY=VALUE", help="Environment settings.")
    p.set_defaults(func=cmd_envs_check)

    p = sub.add_parser("train", help="Train a policy (SFT, GRPO, ...) with one explicit loop.",
                       description="Train a policy. Settings: --config YAML, then --set section.key=value, then the flags below.")
    p.add_argument("--objective", help="Objective name (agentkit objectives list). Default: grpo.")
    p.add_argument("--env", help="Environment id. Default: textworld/coin-v0.")
    p.add_argument("--model", help="Initial policy folder. Default: the tiny default model.")
    p.add_argument("--out", help="Run folder. Default: runs/train.")
    p.add_argument("--config", help="YAML config (sections: env, rollout, objective, train, eval, checkpoint).")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="Override, e.g. --set train.lr=1e-5 (repeatable).")
    p.add_argument("--steps", type=int, help="Training steps.")
    p.add_argument("--group-size", type=int, help="Episodes per task.")
    p.add_argument("--tasks-per-step", type=int, help="Tasks per step.")
    p.add_argument("--demos", help="Demonstrations JSONL for objectives that train on them (sft).")
    p.add_argument("--teacher", help="Teacher for distillation objectives: self | model:DIR | vllm:DIR | openai:URL[#MODEL] (default: the objective's).")
    p.add_argument("--skills", help="Skill bank (file or starter name; default: the env family's starter bank).")
    p.add_argument("--retrieval", help="Skill retrieval: ucb | keyword | full | random (default: ucb).")
    p.add_argument("--seed", type=int, help="Run seed.")
    p.add_argument("--resume", action="store_true", help="Continue the run in --out from its last complete checkpoint.")
    p.add_argument("--quiet", action="store_true", help="No progress bar.")
    p.add_argument("--help-config", action="store_true",
                   help="Print every setting with its default and meaning (with --objective: its args too), then exit.")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("demos", help="Write expert demonstrations as trajectories (for SFT).")
    p.add_argument("--env", required=True, help="Environment id.")
    p.add_argument("--episodes", type=int, default=64, help="Tasks to demonstrate.")
    p.add_argument("--out", required=True, help="Output JSONL.")
    p.add_argument("--model", help="Tokenize with this model's tokenizer (default: the tiny default model).")
    p.add_argument("--split", default="train", help="Task split.")
    p.add_argument("--seed", type=int, default=0, help="First task seed.")
    p.add_argument("--max-turns", type=int, default=50, help="Longest demonstration.")
    p.add_argument("--context", default="chat", choices=["chat", "window"], help="Context mode the policy will use.")
    p.add_argument("--env-kwargs", nargs="*", metavar="KEY=VALUE", help="Environment settings.")
    p.add_argument("--append", action="store_true", help="Append to an existing file.")
    p.add_argument("--overwrite", action="store_true", help="Replace an existing file.")
    p.set_defaults(func=cmd_demos)

    p = sub.add_parser("eval", help="Greedy evaluation of a model on an environment split.")
    p.add_argument("--env", required=True, help="Environment id.")
    p.add_argument("--model", help="Model folder (default: the tiny default model).")
    p.add_argument("--episodes", type=int, default=32, help="Tasks (seeds 0..N-1 of the split).")
    p.add_argument("--split", default="eval", help="Split to evaluate on.")
    p.add_argument("--max-turns", type=int, default=8, help="Turns per episode.")
    p.add_argument("--env-workers", type=int, help="Environment worker processes.")
    p.add_argument("--env-kwargs", nargs="*", metavar="KEY=VALUE", help="Environment settings.")
    p.add_argument("--out", help="Also write the trajectories here.")
    p.add_argument("--skills", help="Skill bank whose retrieved skills the policy sees (skill_grpo policies).")
    p.add_argument("--retrieval", help="Skill retriever with --skills (default: keyword).")
    p.set_defaults(func=cmd_eval)

    objectives = sub.add_parser("objectives", help="List objectives.").add_subparsers(dest="objectives_command", metavar="SUBCOMMAND")
    p = objectives.add_parser("list", help="Every objective, built in or from a plugin.")
    p.set_defaults(func=cmd_objectives_list)

    p = sub.add_parser("plot", help="Plot training curves of one or more runs into a PNG.")
    p.add_argument("runs", nargs="+", help="Run folders (overlaid: one line per run in every panel).")
    p.add_argument("--out", default="curves.png", help="PNG to write.")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("view", help="One self-contained HTML report of trajectories, with token-level teacher signals.",
                       description="Write one static HTML file (no server, no network) listing the episodes of a trajectory "
                                   "file or a training run, with filters, each episode's turns, and per-token colouring by "
                                   "the teacher-student gap, SDAR gate, teacher top-1 confidence when the run recorded them.")
    p.add_argument("source", help="A trajectory file (.jsonl) or a run folder of agentkit train.")
    p.add_argument("--out", default="report.html", help="HTML file to write.")
    p.add_argument("--model", help="Tokenizer folder for token texts (default: the run's checkpoint or model).")
    p.add_argument("--max-episodes", type=int, default=20_000, help="Most episodes put in the report (the first ones read).")
    p.set_defaults(func=cmd_view)

    skills = sub.add_parser("skills", help="Skill banks: list, retrieve, extract.").add_subparsers(
        dest="skills_command", metavar="SUBCOMMAND")
    p = skills.add_parser("list", help="Every skill of a bank with its usage statistics.")
    p.add_argument("bank", help="Bank file (JSON/YAML) or starter name (textworld, alfworld, scienceworld, search_qa).")
    p.set_defaults(func=cmd_skills_list)
    p = skills.add_parser("retrieve", help="The skills a retriever picks for a task.")
    p.add_argument("bank", help="Bank file or starter name.")
    p.add_argument("--task", required=True, help="Task text.")
    p.add_argument("--strategy", default="keyword", help="ucb | keyword | full | random (or a plugin).")
    p.add_argument("-k", type=int, default=3, help="Skills to return.")
    p.add_argument("--env", help="Only skills that apply to this environment id.")
    p.add_argument("--task-type", help="Only skills for this task type (e.g. pick_heat_then_place).")
    p.add_argument("--seed", type=int, default=0, help="Seed of the random retriever.")
    p.set_defaults(func=cmd_skills_retrieve)
    p = skills.add_parser("extract", help="Summarize new skills from won episodes with an LLM (deduplicated).")
    p.add_argument("--trajectories", required=True, help="Trajectory JSONL.")
    p.add_argument("--bank", required=True, help="Bank file to add to (created if missing).")
    p.add_argument("--teacher", required=True, help="The writer: model:DIR (a Hugging Face folder).")
    p.add_argument("--max-new-tokens", type=int, default=96, help="Answer length.")
    p.add_argument("--dedup", type=float, default=0.6, help="Word-overlap (Jaccard) at which a skill is a duplicate.")
    p.set_defaults(func=cmd_skills_extract)

    model = sub.add_parser("model", help="Build models.").add_subparsers(dest="model_command", metavar="SUBCOMMAND")
    p = model.add_parser("init", help="Train a tokenizer and write a randomly initialized tiny Qwen3 model.")
    p.add_argument("--out", required=True, help="Folder to write (must not exist or be empty).")
    p.add_argument("--size", default="tiny", choices=["tiny", "small", "base"], help="Model size preset.")
    p.add_argument("--seed", type=int, default=0, help="Initialization seed.")
    p.add_argument("--vocab-size", type=int, default=3000, help="Tokenizer vocabulary size (at most).")
    p.set_defaults(func=cmd_model_init)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 0 if args.command is None else 2
    try:
        return args.func(args)
    except AgentkitError as err:
        print(f"agentkit: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("agentkit: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
