"""The ``agentkit`` command. Thin: parse, build a config, call one library function.

Heavy imports (torch, transformers, textworld) happen inside the commands so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from agentkit.core import runs
from agentkit.core.errors import AgentkitError, ConfigError


def _quiet_hf() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


# -- settings -----------------------------------------------------------------------------------
def _add_settings(parser: argparse.ArgumentParser, model, *, skip: frozenset[str] = frozenset()) -> None:
    """Every setting of ``model`` as a flag, plus --config and --set (the same keys as YAML)."""
    from agentkit.core.config import add_settings_arguments

    parser.add_argument("--config", help="YAML file of settings (the keys of --set, as sections).")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="Set any setting by its key, e.g. --set env.max_turns=12 (repeatable; flags win).")
    add_settings_arguments(parser, model, skip=skip)


# what a policy trained by `agentkit train` was trained with, and so must be played with
RUN_SETTINGS = ("env.id", "env.kwargs", "env.max_turns", "context.mode", "context.window", "context.show_admissible",
                "context.system_prompt", "sampling.max_new_tokens")


def _run_folder(model: str | None) -> Path | None:
    """The training run a ``--model`` path belongs to: the run folder itself, or the run of one of
    its ``checkpoints/step-N`` folders; None for any other model folder."""
    if not model:
        return None
    path = Path(model)
    for candidate in (path, path.parent.parent if path.parent.name == runs.CHECKPOINTS else None):
        if candidate is not None and runs.config_file(candidate).is_file():
            return candidate
    return None


def _run_settings(model: str | None, keys: set[str], given: dict) -> dict:
    """When ``--model`` is (a checkpoint of) a training run, the settings its policy was trained
    with, as defaults under everything given; a note says so. Its environment settings only when
    the same environment is played, and its skills when the policy saw them in its prompt."""
    run = _run_folder(model)
    if run is None:
        return {}
    from agentkit.objectives import capabilities_of
    from agentkit.train_config import load_config

    saved = load_config(runs.config_file(run))
    wanted = list(RUN_SETTINGS)
    if given.get("env.id", saved.env.id) != saved.env.id:
        wanted = [key for key in wanted if not key.startswith("env.")]
    if capabilities_of(saved.objective.name).policy_sees_skills and runs.skill_bank_file(run).is_file():
        wanted += ["skills.retrieval", "skills.k", "skills.args"]
    base = {}
    for key in wanted:
        if key in keys:
            node = saved
            for part in key.split("."):
                node = getattr(node, part)
            base[key] = node
    if "skills.k" in base:
        base["skills.bank"] = str(runs.skill_bank_file(run))  # the run's own bank, with its statistics
    shown = ", ".join(f"{key}={base[key]}" for key in ("env.id", "context.mode", "skills.bank") if key in base)
    print(f"--model {model}: playing with the settings of the run {run} ({shown}); flags given override them.",
          file=sys.stderr)
    return base


def _settings(args: argparse.Namespace, model, *, what: str, policy: str | None = None):
    """The command's settings from its flags, --set and --config, over the settings of the training
    run the policy (``policy``, else --model) belongs to."""
    from agentkit.core.config import load_settings, parse_assignment, settings_from_args, settings_of

    values = settings_from_args(args, model)
    policy = policy or values.get("model") or dict(parse_assignment(item) for item in args.set or []).get("model")
    given = {**dict(parse_assignment(item) for item in args.set or []), **values}
    base = _run_settings(policy, {row.key for row in settings_of(model)}, given)
    return load_settings(model, args.config, args.set, values, what=what, base=base)


_ABSENT = object()


def _given(args: argparse.Namespace, model) -> dict:
    """The settings this command gives, by dotted key: its flags, its --set items and every setting its
    --config file holds (``train --resume`` compares each with the run's)."""
    from agentkit.core.config import parse_assignment, read_yaml, settings_from_args, settings_of

    given = settings_from_args(args, model)
    for item in args.set or []:
        key, value = parse_assignment(item)
        given.setdefault(key, value)
    loaded = read_yaml(args.config, what="config") if args.config else None
    for row in settings_of(model) if isinstance(loaded, dict) else []:
        value = loaded
        for part in row.key.split("."):
            value = value.get(part, _ABSENT) if isinstance(value, dict) else _ABSENT
        if value is not _ABSENT:
            given.setdefault(row.key, value)
    return given


def _model_dir(model: str | None) -> Path:
    from agentkit.models import ensure_default_model, resolve_model_dir

    return resolve_model_dir(model) if model else ensure_default_model()


# -- rollout ----------------------------------------------------------------------------------
def cmd_rollout(args: argparse.Namespace) -> int:
    from agentkit.rollout.config import RolloutConfig
    from agentkit.rollout.run import resolve_env

    cfg = _settings(args, RolloutConfig, what="rollout settings")
    cfg = cfg.model_copy(update={"env": resolve_env(cfg.env)})
    _quiet_hf()
    from agentkit.rollout.run import check_output, default_out_path, run_rollout
    from agentkit.skillbank import policy_selector

    out = Path(cfg.out) if cfg.out else default_out_path()
    check_output(out, append=cfg.append, overwrite=cfg.overwrite, resume=cfg.resume)
    model_dir = _model_dir(cfg.model)
    from agentkit.core.progress import progress_bar

    bar = progress_bar(total=cfg.episodes * cfg.group_size, desc=f"rollout {cfg.env.id}", unit="ep", disable=args.quiet)

    def progress(trajectory, stats) -> None:
        bar.update(1)
        bar.set_postfix(success=f"{stats.success_rate:.2f}", ret=f"{stats.mean_return:.2f}")

    plans = []

    def on_resume(plan) -> None:
        plans.append(plan)
        bar.reset(total=len(plan.remaining))
        bar.set_description(f"rollout {cfg.env.id} (resumed, {plan.done} already done)")

    try:
        stats, out = run_rollout(cfg, model_dir, progress=progress, out=out, on_resume=on_resume,
                                 skills=policy_selector(cfg.skills, env_id=cfg.env.id, seed=cfg.seed))
    except KeyboardInterrupt:
        bar.close()
        print(f"agentkit: interrupted; {_interrupted_note(cfg, out)}", file=sys.stderr)
        return 130
    finally:
        bar.close()
    console = _stdout_console()
    if plans and not plans[0].remaining:
        console.print(f"nothing to resume: {out} already holds all {plans[0].done} trajectories of this command"
                      + _torn_note(plans[0]))
        return 0
    _print_summary(console, cfg.env.id, stats, out, resumed=plans[0] if plans else None)
    console.print(f"next: agentkit view {out} --out report.html  (browse the episodes)")
    return 0


def _interrupted_note(cfg, out: Path) -> str:
    """Where an interrupted rollout left its episodes, and how to go on."""
    if not out.exists() or out.stat().st_size == 0:
        return f"no episode had finished; nothing was written to {out} (games made so far stay cached)."
    if cfg.overwrite:  # the new file replaces the old one only once it is complete
        return f"{out} was not replaced (--overwrite keeps the old file until the new one is complete)."
    if cfg.append:
        return (f"the episodes that finished were appended to {out}; --resume does not apply to an appended file: "
                "rerun with --append and the seeds still missing (--seed, --episodes).")
    argv = [arg for arg in sys.argv[1:] if arg != "--resume"]
    again = " ".join(["agentkit", *argv, *([] if "--out" in argv else ["--out", str(out)]), "--resume"])
    return f"the finished episodes are in {out}. Complete the rollout with: {again}"


def _torn_note(plan) -> str:
    return (f" (a torn last line of {plan.torn_bytes} bytes, from the interrupted write, was moved to {plan.torn_path})"
            if plan.torn_bytes else "")


def _stdout_console():
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # logs and pipes get the whole table on one line per row
        console.width = max(console.width, 140)
    return console


def _print_summary(console, env_id: str, stats, out: Path | None, *, resumed=None, command: str = "rollout") -> None:
    from rich.table import Table

    table = Table(title=f"agentkit {command}: {env_id}")
    for col in ("episodes", "success rate", "mean return", "mean turns", "invalid actions", "tokens/s", "env steps/s"):
        table.add_column(col, justify="right")
    table.add_row(str(stats.episodes), f"{stats.success_rate:.1%}", f"{stats.mean_return:.3f}", f"{stats.mean_turns:.1f}",
                  f"{stats.invalid_rate:.1%}", f"{stats.tokens_per_s:.0f}", f"{stats.env_steps_per_s:.1f}")
    console.print(table)
    note = f" ({stats.errors} ended by errors)" if stats.errors else ""
    if out is None:
        return
    if resumed is not None:
        console.print(f"resumed {out}: {resumed.done} trajectories were already there, played and appended "
                      f"{stats.episodes}{note}; it now holds {resumed.done + stats.episodes}" + _torn_note(resumed))
        return
    console.print(f"wrote {stats.episodes} trajectories to {out}{note}")


# -- envs -------------------------------------------------------------------------------------
def cmd_envs_list(args: argparse.Namespace) -> int:
    """One line per environment: its id, status and turn limit whole, its splits, then its
    description, or for one not installed its pip command (whole) and what is missing, then its
    registered settings and the plugin it comes from; a terminal too narrow cuts the splits and the
    end of the line with an ellipsis, a log gets every row whole. Cells are plain text, never rich
    markup (which would eat the ``[extra]`` of ``pip install 'agentkit[extra]'``)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from agentkit.envs import env_info, status

    rows = status()
    lines = []
    for row in rows:
        try:
            info = env_info(row.id)
        except AgentkitError:  # a broken plugin: its row says what is wrong
            info = None
        splits = ", ".join(s + "*" if s == info.eval_split else s for s in info.splits) if info else ""
        settings = " ".join(f"{k}={v}" for k, v in info.kwargs.items()) if info else ""
        about = (row.detail + (f"; {settings}" if settings and row.available else "")
                 + (f"; from {row.distribution}" if row.distribution != "agentkit" else ""))
        lines.append([Text(row.id), Text("installed") if row.available else Text("missing", style="red"),
                      Text(str(info.max_turns) if info else ""), Text(splits), Text(about)])
    console = _stdout_console()
    headers = ["id", "status", "turns", "splits", "description; settings"]
    widths = [max([len(header), *(len(cells[column]) for cells in lines)]) for column, header in enumerate(headers)]
    if console.is_terminal:  # one line a row: the splits and the description share what the rest leaves
        room = console.width - sum(widths[:3]) - 3 * len(headers)
        # the pip command whole (and the ellipsis after it)
        hint = max([12, *(len(row.detail.split(";")[0]) + 1 for row in rows if not row.available)])
        widths[3] = min(widths[3], max(8, room - hint))
        widths[4] = min(widths[4], max(hint, room - widths[3]))
    else:  # a log or a pipe: every row whole, on one line
        console.width = max(console.width, sum(widths) + 3 * len(headers))
    table = Table(title="agentkit environments (* the held-out split)", box=box.SIMPLE_HEAD, pad_edge=False,
                  title_justify="left")
    for header, width in zip(headers, widths, strict=True):
        table.add_column(header, no_wrap=True, overflow="ellipsis", width=width,
                         justify="right" if header == "turns" else "left")
    for cells in lines:
        table.add_row(*cells)
    console.print(table)
    return 0


def cmd_envs_check(args: argparse.Namespace) -> int:
    import time

    from agentkit.core.config import parse_pairs
    from agentkit.envs import check_env, make, play_expert

    env = make(args.id, **(parse_pairs(args.env_kwargs, "--env-kwargs") if args.env_kwargs else {}))
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
    from agentkit.train_config import TrainConfig, describe_config, load_config

    if args.help_config:
        print("Settings (--config YAML sections, --set KEY=VALUE, or the flags shown):\n"
              + describe_config(vars(args).get("setting:objective.name")))
        return 0
    from agentkit.core.config import settings_from_args

    given = _given(args, TrainConfig)
    cfg = load_config(args.config, args.set, settings_from_args(args, TrainConfig))
    _quiet_hf()
    from agentkit.train import train

    result = train(cfg, resume=args.resume, show_progress=not args.quiet, given=given)
    if os.environ.get("RANK", "0") == "0":  # once, not per training process
        print(result.summary())
    return 0


def cmd_demos(args: argparse.Namespace) -> int:
    from agentkit.rollout.config import DemosConfig
    from agentkit.rollout.run import resolve_env

    cfg = _settings(args, DemosConfig, what="demos settings")
    cfg = cfg.model_copy(update={"env": resolve_env(cfg.env)})
    _quiet_hf()
    from agentkit.rollout.demos import write_demonstrations
    from agentkit.rollout.hf_backend import load_tokenizer
    from agentkit.rollout.run import check_env_settings, check_output, env_factory

    out = Path(cfg.out)
    check_output(out, append=cfg.append, overwrite=cfg.overwrite)
    check_env_settings(cfg.env, cfg.split, range(cfg.seed, cfg.seed + cfg.episodes))  # bad settings fail now
    tokenizer = load_tokenizer(_model_dir(cfg.model))
    make_env = env_factory(cfg.env.id, split=cfg.split, max_turns=cfg.env.max_turns, env_kwargs=cfg.env.kwargs)
    mode = "append" if cfg.append else "overwrite" if cfg.overwrite else "new"
    from agentkit.core.progress import progress_bar

    seeds = progress_bar(range(cfg.seed, cfg.seed + cfg.episodes), desc=f"demos {cfg.env.id}", unit="ep",
                         disable=args.quiet)
    written, lost = write_demonstrations(
        make_env, tokenizer, out, env_id=cfg.env.id, seeds=seeds, split=cfg.split, mode=mode,
        context=cfg.context.mode, window=cfg.context.window, show_admissible=cfg.context.show_admissible,
        system_prompt=cfg.context.system_prompt, model=str(cfg.model or "expert"))
    print(f"wrote {written} expert demonstrations to {out}" + (f" ({lost} lost episodes skipped)" if lost else ""))
    return 0


def _eval_settings(args: argparse.Namespace, policy: str | None = None):
    """``eval``'s settings with the environment's defaults filled in (``policy``: one of --compare's models)."""
    from agentkit.rollout.config import EvalConfig
    from agentkit.rollout.run import held_out_split, resolve_env

    cfg = _settings(args, EvalConfig, what="eval settings", policy=policy)
    if policy is not None:
        cfg = cfg.model_copy(update={"model": policy, "compare": []})
    return cfg.model_copy(update={"env": resolve_env(cfg.env), "split": cfg.split or held_out_split(cfg.env.id)})


def _play_eval(args: argparse.Namespace, cfg, model_dir: Path, *, label: str = "") -> tuple:
    """One model's (``model_dir``: ``cfg.model`` resolved) evaluation episodes with a progress bar:
    (stats, trajectories)."""
    from agentkit.core.progress import progress_bar
    from agentkit.rollout.run import check_output, run_eval
    from agentkit.skillbank import policy_selector

    out = Path(cfg.out) if cfg.out else None
    if out is not None:
        check_output(out, append=cfg.append, overwrite=cfg.overwrite)
    bar = progress_bar(total=cfg.episodes * cfg.samples, desc=f"eval {label}{cfg.env.id} ({cfg.split})", unit="ep",
                       disable=args.quiet)
    played: list = []
    try:
        stats = run_eval(cfg, model_dir, out=out, progress=lambda t, s: bar.update(1),
                         skills=policy_selector(cfg.skills, env_id=cfg.env.id, seed=cfg.seed), played=played)
    finally:
        bar.close()
    return stats, played


def _write_report(console, path: str | None, report: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(report, indent=1))
        console.print(f"wrote the report to {path}")


def cmd_eval(args: argparse.Namespace) -> int:
    cfg = _eval_settings(args)
    _quiet_hf()
    if cfg.compare:
        return _compare(args, cfg)
    model_dir = _model_dir(cfg.model)  # once, first: a run folder's note comes before any result
    stats, played = _play_eval(args, cfg, model_dir)
    how = "greedy" if cfg.samples == 1 else f"{cfg.samples} samples per task at temperature 1"
    console = _stdout_console()
    _print_summary(console, f"{cfg.env.id} ({cfg.split}, {how})", stats, cfg.out and Path(cfg.out), command="eval")
    from agentkit.rollout.report import eval_report

    report = eval_report(played)
    _print_report(console, report)
    _write_report(console, cfg.report, {"model": str(model_dir), "env": cfg.env.id, "split": cfg.split, **report})
    return 0


# what must be equal for two models' episodes to be the same tasks and seeds
_PAIRED = ("env", "split", "seed", "episodes", "samples")


def _compare(args: argparse.Namespace, cfg) -> int:
    """``eval --compare A B``: both models play the same tasks and seeds (each with the settings of
    its own training run, as ``--model`` would), then the paired difference of their success."""
    from agentkit.rollout.report import compare_report

    cfgs = [_eval_settings(args, policy) for policy in cfg.compare]
    differ = [name for name in _PAIRED if getattr(cfgs[0], name) != getattr(cfgs[1], name)]
    if differ:
        shown = "; ".join(f"{name}: {getattr(cfgs[0], name)!r} vs {getattr(cfgs[1], name)!r}" for name in differ)
        raise ConfigError(f"--compare: the two runs would play different tasks ({shown}); give the setting as a flag "
                          "(e.g. --env ID --env-kwargs ...) so both play the same.")
    console = _stdout_console()
    model_dirs = [_model_dir(one.model) for one in cfgs]  # once, first: a run folder's note comes before any result
    played = []
    for label, one, model_dir in zip("AB", cfgs, model_dirs, strict=True):
        stats, episodes = _play_eval(args, one, model_dir, label=f"{label} ")
        _print_summary(console, f"{label}: {one.model} on {one.env.id} ({one.split})", stats, None, command="eval")
        played.append(episodes)
    report = compare_report(*played)
    for label in "ab":
        console.print(f"{label.upper()}: ", end="")
        _print_report(console, report[label])
    low, high = report["difference_ci95"]
    console.print(f"paired difference A - B over {report['tasks']} tasks: {report['difference']:+.1%} "
                  f"(95% CI {low:+.1%} to {high:+.1%})" + ("; the interval holds 0: no difference shown"
                                                           if low <= 0 <= high else ""))
    _write_report(console, cfg.report, {"model_a": str(model_dirs[0]), "model_b": str(model_dirs[1]),
                                        "env": cfg.env.id, "split": cfg.split, **report})
    return 0


def _print_report(console, report: dict) -> None:
    """Success with its 95% interval, pass@k, and the per-type rows of ``eval_report``."""
    low, high = report["success_ci95"]
    solved = report["mean_turns_solved"]
    line = (f"success {report['success_rate']:.1%} (95% CI {low:.1%}-{high:.1%}, {report['episodes']} episodes of "
            f"{report['tasks']} tasks); mean turns of solved episodes: {'-' if solved is None else f'{solved:.1f}'}")
    console.print(line)
    if "pass_at_k" in report:
        console.print("pass@k: " + ", ".join(f"pass@{k} {v:.1%}" for k, v in report["pass_at_k"].items()))
    for name, row in report.get("by_task_type", {}).items():
        low, high = row["success_ci95"]
        console.print(f"  {name}: success {row['success_rate']:.1%} (95% CI {low:.1%}-{high:.1%}, {row['episodes']} "
                      "episodes)" + (f", pass@{row['samples_per_task']} {list(row['pass_at_k'].values())[-1]:.1%}"
                                     if "pass_at_k" in row else ""))


def cmd_objectives_list(args: argparse.Namespace) -> int:
    from agentkit.objectives import describe

    rows = describe()
    width = max((len(name) for name, _, _ in rows), default=0)
    for name, dist, about in rows:
        print(f"{name:{width + 1}} {about or '(no description)'}  [{dist}]")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from agentkit.plots import plot_runs

    for run in args.runs:
        if not runs.metrics_file(Path(run)).exists():
            raise ConfigError(f"{run} is not a run folder (no metrics.jsonl).")
    print(f"wrote {plot_runs([Path(r) for r in args.runs], Path(args.out))}")
    return 0


def cmd_view(args: argparse.Namespace) -> int:
    from agentkit.view import write_report

    if args.max_episodes <= 0:
        raise ConfigError(f"--max-episodes must be positive, got {args.max_episodes}.")
    out, episodes = write_report(Path(args.source), Path(args.out), model=args.model, max_episodes=args.max_episodes,
                                 episode=args.episode)
    print(f"wrote {out} ({episodes} episodes); open it in a browser")
    if args.episode is not None:
        from agentkit.view import episode_anchor

        print(f"episode {args.episode}: {out.resolve().as_uri()}#{episode_anchor(args.episode)}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from agentkit.rollout.export import export

    written, rows = export(args.source, args.to, args.out)
    read = (f"datasets.load_from_disk({str(written)!r})" if args.to == "hf"
            else f"datasets.load_dataset('parquet', data_files={str(written)!r}, split='train')")
    print(f"wrote {rows} trajectories to {written}; read them with {read}, or train on them with --demos {written}")
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
        print(f"{s.id:26} uses {s.stats.uses:5d}  mean reward {s.stats.mean_reward:6.3f}  [{where}]  {s.title}")
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
    from agentkit.rollout.backend import chat_completer
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
    report = extract_skills(trajectories, bank, chat_completer(HFBackend(arg), args.max_new_tokens),
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
    from agentkit.core.settings import SkillSettings
    from agentkit.models import SIZES
    from agentkit.rollout.config import DemosConfig, EvalConfig, RolloutConfig
    from agentkit.train_config import TrainConfig

    parser = argparse.ArgumentParser(prog="agentkit", description="Train LLM agents on multi-turn text environments.")
    parser.add_argument("--version", action="version", version=f"agentkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("rollout", help="Play episodes with a policy and write trajectories (JSONL).",
                       description="Play episodes with a policy and write turn-segmented, token-exact trajectories. "
                                   "Every setting has a flag and a --set key (the same in train, eval and demos).")
    _add_settings(p, RolloutConfig)
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

    p = sub.add_parser("train", help="Train a policy (SFT, GRPO, OPD, SDAR, SAGE-OPD, ...) with one explicit loop.",
                       description="Train a policy. Settings: --config YAML, then --set section.key=value, then the "
                                   "flags below (every setting has one). --help-config lists them by key.")
    _add_settings(p, TrainConfig)
    p.add_argument("--resume", action="store_true",
                   help="Continue the run in --out from its last complete checkpoint with its saved settings "
                        "(--steps may extend it; a setting of what the run computes given another value is refused, "
                        "one of how it runs, such as --env-workers, is applied to this invocation).")
    p.add_argument("--quiet", action="store_true", help="No progress bar.")
    p.add_argument("--help-config", action="store_true",
                   help="Print every setting with its key, flag, default and meaning (with --objective: its args too), then exit.")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("demos", help="Write expert demonstrations as trajectories (for SFT).",
                       description="Play the environment's expert plans and write them as trajectories, in the "
                                   "context mode the policy will be trained with.")
    _add_settings(p, DemosConfig)
    p.add_argument("--quiet", action="store_true", help="No progress bar.")
    p.set_defaults(func=cmd_demos)

    p = sub.add_parser("eval", help="Greedy evaluation of a model on an environment's held-out split.",
                       description="Greedy evaluation. Give the context settings the policy was trained with "
                                   "(--context, --window, --max-new-tokens, --max-turns, --env-kwargs).")
    _add_settings(p, EvalConfig)
    p.add_argument("--quiet", action="store_true", help="No progress bar.")
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
    p.add_argument("source", help="A trajectory file (.jsonl), a run folder of agentkit train, or a dataset of "
                                     "agentkit export (a Parquet file or folder, a save_to_disk folder).")
    p.add_argument("--out", default="report.html", help="HTML file to write.")
    p.add_argument("--model", help="Tokenizer folder for token texts (default: the run's checkpoint or model).")
    p.add_argument("--max-episodes", type=int, default=20_000, help="Most episodes put in the report (the first ones read).")
    p.add_argument("--episode", metavar="ID", help="Also print the link that opens the report at this episode (a "
                   "trajectory id, as the trackers' episode tables give it).")
    p.set_defaults(func=cmd_view)

    from agentkit.rollout.export import FORMATS

    p = sub.add_parser("export", help="Trajectories as a Hugging Face dataset (Parquet or save_to_disk).",
                       description="Write the trajectories of a run folder or a JSONL file as a datasets.Dataset, one row "
                                   "per episode with its turns nested and token ids as int lists; --demos reads it back. "
                                   "Needs the datasets extra.")
    p.add_argument("source", help="A run folder of agentkit train or a trajectory file (.jsonl).")
    p.add_argument("--to", required=True, choices=FORMATS,
                   help="parquet: DIR/trajectories.parquet (load_dataset('parquet', ...)); hf: a save_to_disk folder "
                        "(datasets.load_from_disk).")
    p.add_argument("out", metavar="DIR", help="A new (or empty) folder for the dataset.")
    p.set_defaults(func=cmd_export)

    skills = sub.add_parser("skills", help="Skill banks: list, retrieve, extract.").add_subparsers(
        dest="skills_command", metavar="SUBCOMMAND")
    p = skills.add_parser("list", help="Every skill of a bank with its usage statistics.")
    p.add_argument("bank", help="Bank file (JSON/YAML) or starter name (textworld, alfworld, scienceworld, search_qa).")
    p.set_defaults(func=cmd_skills_list)
    p = skills.add_parser("retrieve", help="The skills a retriever picks for a task.")
    p.add_argument("bank", help="Bank file or starter name.")
    p.add_argument("--task", required=True, help="Task text.")
    p.add_argument("--strategy", default=SkillSettings.model_fields["retrieval"].default,
                   help="ucb | keyword | full | random (or a plugin); the default is that of --retrieval.")
    p.add_argument("-k", type=int, default=SkillSettings.model_fields["k"].default, help="Skills to return.")
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
    p.add_argument("--size", default="tiny", choices=list(SIZES), help="Model size preset (qwen3-0.6b, qwen3-1.7b: those models' shapes, random init).")
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
