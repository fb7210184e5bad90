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
    import yaml

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--env-kwargs expects key=value pairs, got {pair!r} (e.g. --env-kwargs level=10).")
        out[key.strip()] = yaml.safe_load(value)
    return out


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
    check_output(out, append=cfg.append, overwrite=cfg.overwrite)
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

    try:
        stats, out = run_rollout(cfg, model_dir, progress=progress, out=out)
    finally:
        bar.close()
    _print_summary(_stdout_console(), cfg.env, stats, out)
    return 0


def _stdout_console():
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # logs and pipes get the whole table on one line per row
        console.width = max(console.width, 140)
    return console


def _print_summary(console, env_id: str, stats, out: Path) -> None:
    from rich.table import Table

    table = Table(title=f"agentkit rollout: {env_id}")
    for col in ("episodes", "success rate", "mean return", "mean turns", "invalid actions", "tokens/s", "env steps/s"):
        table.add_column(col, justify="right")
    table.add_row(str(stats.episodes), f"{stats.success_rate:.1%}", f"{stats.mean_return:.3f}", f"{stats.mean_turns:.1f}",
                  f"{stats.invalid_rate:.1%}", f"{stats.tokens_per_s:.0f}", f"{stats.env_steps_per_s:.1f}")
    console.print(table)
    note = f" ({stats.errors} ended by errors)" if stats.errors else ""
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
