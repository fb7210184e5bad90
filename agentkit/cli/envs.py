"""``agentkit envs list | check``: the environments and whether they work."""

from __future__ import annotations

import argparse

from agentkit.cli.common import stdout_console
from agentkit.core.errors import AgentkitError


def add_parsers(sub) -> None:
    """This module's commands on the ``agentkit`` parser's subcommands."""
    envs = sub.add_parser("envs", help="List and check environments.").add_subparsers(dest="envs_command", metavar="SUBCOMMAND")
    p = envs.add_parser("list", help="Every environment and whether it is installed.")
    p.set_defaults(func=cmd_envs_list)
    p = envs.add_parser("check", help="Validate an environment against the protocol.")
    p.add_argument("id", help="Environment id.")
    p.add_argument("--seed", type=int, default=0, help="First task seed to check with.")
    p.add_argument("--tasks", type=int, default=3, help="Tasks on which to play the expert plan (all must be won).")
    p.add_argument("--env-kwargs", nargs="*", metavar="KEY=VALUE", help="Environment settings.")
    p.set_defaults(func=cmd_envs_check)


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
    console = stdout_console()
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
