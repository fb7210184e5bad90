"""What the commands share: settings from flags, --set and --config (over a training run's when the
policy is one), the model folder, the summary table."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def quiet_hf() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def add_settings(parser: argparse.ArgumentParser, model, *, skip: frozenset[str] = frozenset()) -> None:
    """Every setting of ``model`` as a flag, plus --config and --set (the same keys as YAML)."""
    from agentkit.core.config import add_settings_arguments

    parser.add_argument("--config", help="YAML file of settings (the keys of --set, as sections).")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="Set any setting by its key, e.g. --set env.max_turns=12 (repeatable; flags win).")
    add_settings_arguments(parser, model, skip=skip)


def run_settings(model: str | None, keys: set[str], given: dict) -> dict:
    """``rollout.run.trained_settings``, with a note on stderr when there are any."""
    from agentkit.rollout.run import trained_settings, training_run_of

    base = trained_settings(model, keys, given)
    if base:
        shown = ", ".join(f"{key}={base[key]}" for key in ("env.id", "context.mode", "skills.bank") if key in base)
        print(f"--model {model}: playing with the settings of the run {training_run_of(model)} ({shown}); flags given "
              "override them.", file=sys.stderr)
    return base


def command_settings(args: argparse.Namespace, model, *, what: str, policy: str | None = None):
    """The command's settings from its flags, --set and --config, over the settings of the training
    run the policy (``policy``, else --model) belongs to."""
    from agentkit.core.config import load_settings, parse_assignment, settings_from_args, settings_of

    values = settings_from_args(args, model)
    policy = policy or values.get("model") or dict(parse_assignment(item) for item in args.set or []).get("model")
    given = {**dict(parse_assignment(item) for item in args.set or []), **values}
    base = run_settings(policy, {row.key for row in settings_of(model)}, given)
    return load_settings(model, args.config, args.set, values, what=what, base=base)


def given_settings(args: argparse.Namespace, model) -> dict:
    """The settings this command gives, by dotted key: its flags, its --set items and every setting its
    --config file holds (``train --resume`` compares each with the run's)."""
    from agentkit.core.config import (
        MISSING,
        get_dotted,
        parse_assignment,
        read_yaml,
        settings_from_args,
        settings_of,
    )

    given = settings_from_args(args, model)
    for item in args.set or []:
        key, value = parse_assignment(item)
        given.setdefault(key, value)
    loaded = read_yaml(args.config, what="config") if args.config else None
    for row in settings_of(model) if isinstance(loaded, dict) else []:
        if (value := get_dotted(loaded, row.key)) is not MISSING:
            given.setdefault(row.key, value)
    return given


def policy_folder(model: str | None) -> Path:
    from agentkit.models import ensure_default_model, resolve_model_dir

    return resolve_model_dir(model) if model else ensure_default_model()


def torn_note(plan) -> str:
    return (f" (a torn last line of {plan.torn_bytes} bytes, from the interrupted write, was moved to {plan.torn_path})"
            if plan.torn_bytes else "")


def stdout_console():
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # logs and pipes get the whole table on one line per row
        console.width = max(console.width, 140)
    return console


def print_summary(console, env_id: str, stats, out: Path | None, *, resumed=None, command: str = "rollout") -> None:
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
                      f"{stats.episodes}{note}; it now holds {resumed.done + stats.episodes}" + torn_note(resumed))
        return
    console.print(f"wrote {stats.episodes} trajectories to {out}{note}")
