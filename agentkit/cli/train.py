"""``agentkit train``, ``agentkit demos`` (what SFT trains on) and ``agentkit objectives list``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from agentkit.cli.common import add_settings, command_settings, given_settings, policy_folder, quiet_hf


def add_parsers(sub) -> None:
    """This module's commands on the ``agentkit`` parser's subcommands."""
    from agentkit.rollout.config import DemosConfig
    from agentkit.train.config import TrainConfig

    p = sub.add_parser("train", help="Train a policy (SFT, GRPO, OPD, SDAR, SAGE-OPD, ...) with one explicit loop.",
                       description="Train a policy. Settings: --config YAML, then --set section.key=value, then the "
                                   "flags below (every setting has one). --help-config lists them by key.")
    add_settings(p, TrainConfig)
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
    add_settings(p, DemosConfig)
    p.add_argument("--quiet", action="store_true", help="No progress bar.")
    p.set_defaults(func=cmd_demos)

    objectives = sub.add_parser("objectives", help="List objectives.").add_subparsers(dest="objectives_command", metavar="SUBCOMMAND")
    p = objectives.add_parser("list", help="Every objective, built in or from a plugin.")
    p.set_defaults(func=cmd_objectives_list)


def cmd_train(args: argparse.Namespace) -> int:
    from agentkit.train.config import TrainConfig, describe_config, load_config

    if args.help_config:
        print("Settings (--config YAML sections, --set KEY=VALUE, or the flags shown):\n"
              + describe_config(vars(args).get("setting:objective.name")))
        return 0
    from agentkit.core.config import settings_from_args

    given = given_settings(args, TrainConfig)
    cfg = load_config(args.config, args.set, settings_from_args(args, TrainConfig))
    quiet_hf()
    from agentkit.train import train

    result = train(cfg, resume=args.resume, show_progress=not args.quiet, given=given)
    if os.environ.get("RANK", "0") == "0":  # once, not per training process
        print(result.summary())
    return 0


def cmd_demos(args: argparse.Namespace) -> int:
    from agentkit.rollout.config import DemosConfig
    from agentkit.rollout.run import resolve_env

    cfg = command_settings(args, DemosConfig, what="demos settings")
    cfg = cfg.model_copy(update={"env": resolve_env(cfg.env)})
    quiet_hf()
    from agentkit.rollout.demos import write_demonstrations
    from agentkit.rollout.hf_backend import load_tokenizer
    from agentkit.rollout.run import check_env_settings, check_output, env_factory

    out = Path(cfg.out)
    check_output(out, append=cfg.append, overwrite=cfg.overwrite)
    check_env_settings(cfg.env, cfg.split, range(cfg.seed, cfg.seed + cfg.episodes))  # bad settings fail now
    tokenizer = load_tokenizer(policy_folder(cfg.model))
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


def cmd_objectives_list(args: argparse.Namespace) -> int:
    from agentkit.objectives import describe

    rows = describe()
    width = max((len(name) for name, _, _ in rows), default=0)
    for name, dist, about in rows:
        print(f"{name:{width + 1}} {about or '(no description)'}  [{dist}]")
    return 0
