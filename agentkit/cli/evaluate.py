"""``agentkit eval``: greedy evaluation of one policy, or two paired (``--compare``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agentkit.cli.common import (
    add_settings,
    command_settings,
    policy_folder,
    print_summary,
    quiet_hf,
    stdout_console,
)
from agentkit.core.errors import ConfigError


def add_parsers(sub) -> None:
    """This module's commands on the ``agentkit`` parser's subcommands."""
    from agentkit.rollout.config import EvalConfig

    p = sub.add_parser("eval", help="Greedy evaluation of a model on an environment's held-out split.",
                       description="Greedy evaluation. Give the context settings the policy was trained with "
                                   "(--context, --window, --max-new-tokens, --max-turns, --env-kwargs).")
    add_settings(p, EvalConfig)
    p.add_argument("--quiet", action="store_true", help="No progress bar.")
    p.set_defaults(func=cmd_eval)


def _eval_settings(args: argparse.Namespace, policy: str | None = None):
    """``eval``'s settings with the environment's defaults filled in (``policy``: one of --compare's models)."""
    from agentkit.rollout.config import EvalConfig
    from agentkit.rollout.run import held_out_split, resolve_env

    cfg = command_settings(args, EvalConfig, what="eval settings", policy=policy)
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
    quiet_hf()
    if cfg.compare:
        return _compare(args, cfg)
    model_dir = policy_folder(cfg.model)  # once, first: a run folder's note comes before any result
    stats, played = _play_eval(args, cfg, model_dir)
    how = "greedy" if cfg.samples == 1 else f"{cfg.samples} samples per task at temperature 1"
    console = stdout_console()
    print_summary(console, f"{cfg.env.id} ({cfg.split}, {how})", stats, cfg.out and Path(cfg.out), command="eval")
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
    console = stdout_console()
    model_dirs = [policy_folder(one.model) for one in cfgs]  # once, first: a run folder's note comes before any result
    played = []
    for label, one, model_dir in zip("AB", cfgs, model_dirs, strict=True):
        stats, episodes = _play_eval(args, one, model_dir, label=f"{label} ")
        print_summary(console, f"{label}: {one.model} on {one.env.id} ({one.split})", stats, None, command="eval")
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
