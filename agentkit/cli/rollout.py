"""``agentkit rollout``: play episodes with a policy and write trajectories."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentkit.cli.common import (
    add_settings,
    command_settings,
    policy_folder,
    print_summary,
    quiet_hf,
    stdout_console,
    torn_note,
)


def add_parsers(sub) -> None:
    """This module's commands on the ``agentkit`` parser's subcommands."""
    from agentkit.rollout.config import RolloutConfig

    p = sub.add_parser("rollout", help="Play episodes with a policy and write trajectories (JSONL).",
                       description="Play episodes with a policy and write turn-segmented, token-exact trajectories. "
                                   "Every setting has a flag and a --set key (the same in train, eval and demos).")
    add_settings(p, RolloutConfig)
    p.add_argument("--quiet", action="store_true", help="No progress bar.")
    p.set_defaults(func=cmd_rollout)


def cmd_rollout(args: argparse.Namespace) -> int:
    from agentkit.rollout.config import RolloutConfig
    from agentkit.rollout.run import resolve_env

    cfg = command_settings(args, RolloutConfig, what="rollout settings")
    cfg = cfg.model_copy(update={"env": resolve_env(cfg.env)})
    quiet_hf()
    from agentkit.rollout.run import check_output, default_out_path, run_rollout
    from agentkit.skillbank import policy_selector

    out = Path(cfg.out) if cfg.out else default_out_path()
    check_output(out, append=cfg.append, overwrite=cfg.overwrite, resume=cfg.resume)
    model_dir = policy_folder(cfg.model)
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
    console = stdout_console()
    if plans and not plans[0].remaining:
        console.print(f"nothing to resume: {out} already holds all {plans[0].done} trajectories of this command"
                      + torn_note(plans[0]))
        return 0
    print_summary(console, cfg.env.id, stats, out, resumed=plans[0] if plans else None)
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
