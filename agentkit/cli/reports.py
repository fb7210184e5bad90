"""``agentkit plot | view | export``: curves, the HTML report and datasets from runs and trajectory files."""

from __future__ import annotations

import argparse
from pathlib import Path

from agentkit.core import runs
from agentkit.core.errors import ConfigError


def add_parsers(sub) -> None:
    """This module's commands on the ``agentkit`` parser's subcommands."""
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


def cmd_plot(args: argparse.Namespace) -> int:
    from agentkit.report.plots import plot_runs

    for run in args.runs:
        if not runs.metrics_file(Path(run)).exists():
            raise ConfigError(f"{run} is not a run folder (no metrics.jsonl).")
    print(f"wrote {plot_runs([Path(r) for r in args.runs], Path(args.out))}")
    return 0


def cmd_view(args: argparse.Namespace) -> int:
    from agentkit.report.view import write_report

    if args.max_episodes <= 0:
        raise ConfigError(f"--max-episodes must be positive, got {args.max_episodes}.")
    out, episodes = write_report(Path(args.source), Path(args.out), model=args.model, max_episodes=args.max_episodes,
                                 episode=args.episode)
    print(f"wrote {out} ({episodes} episodes); open it in a browser")
    if args.episode is not None:
        from agentkit.report.view import episode_anchor

        print(f"episode {args.episode}: {out.resolve().as_uri()}#{episode_anchor(args.episode)}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from agentkit.rollout.export import export

    written, rows = export(args.source, args.to, args.out)
    read = (f"datasets.load_from_disk({str(written)!r})" if args.to == "hf"
            else f"datasets.load_dataset('parquet', data_files={str(written)!r}, split='train')")
    print(f"wrote {rows} trajectories to {written}; read them with {read}, or train on them with --demos {written}")
    return 0
