"""The ``agentkit`` command. Thin: parse, build a config, call one library function.

One module per group of commands, each command's parser next to its handler (``add_parsers``);
``common`` holds what they share. Heavy imports (torch, transformers, textworld) happen inside the
commands so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import sys

from agentkit.cli import envs, evaluate, model, reports, rollout, skills, train
from agentkit.core.errors import AgentkitError

# the order of ``agentkit --help``'s commands
COMMANDS = (rollout, envs, train, evaluate, reports, skills, model)


def build_parser() -> argparse.ArgumentParser:
    from agentkit import __version__

    parser = argparse.ArgumentParser(prog="agentkit", description="Train LLM agents on multi-turn text environments.")
    parser.add_argument("--version", action="version", version=f"agentkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for commands in COMMANDS:
        commands.add_parsers(sub)
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
