"""``agentkit model init``: build a tokenizer and a random-init model offline."""

from __future__ import annotations

import argparse

from agentkit.cli.common import quiet_hf


def add_parsers(sub) -> None:
    """This module's commands on the ``agentkit`` parser's subcommands."""
    from agentkit.models import SIZES

    model = sub.add_parser("model", help="Build models.").add_subparsers(dest="model_command", metavar="SUBCOMMAND")
    p = model.add_parser("init", help="Train a tokenizer and write a randomly initialized tiny Qwen3 model.")
    p.add_argument("--out", required=True, help="Folder to write (must not exist or be empty).")
    p.add_argument("--size", default="tiny", choices=list(SIZES), help="Model size preset (qwen3-0.6b, qwen3-1.7b: those models' shapes, random init).")
    p.add_argument("--seed", type=int, default=0, help="Initialization seed.")
    p.add_argument("--vocab-size", type=int, default=3000, help="Tokenizer vocabulary size (at most).")
    p.set_defaults(func=cmd_model_init)


def cmd_model_init(args: argparse.Namespace) -> int:
    quiet_hf()
    from agentkit.models import init_model

    path = init_model(args.out, size=args.size, seed=args.seed, vocab_size=args.vocab_size)
    print(f"wrote a {args.size} model and tokenizer to {path}")
    return 0
