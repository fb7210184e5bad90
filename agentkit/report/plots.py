"""Training curves as a PNG: success rate, return, loss, eval success and the objective's metrics.

Several runs are overlaid, one line per run in every panel, each run in the same colour in every
panel. Steps trained on demonstrations (SFT warm-up) record the expert's episodes, not the
policy's: their success rate and return are drawn dotted and labelled as such. The PNG records what it drew in its
``Description`` text chunk (JSON: panel -> run -> number of points), so a test or a script can
check the series without reading pixels.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from agentkit.core import runs as run_files
from agentkit.core.jsonl import read_records

BASE = ["success_rate", "return_mean", "loss"]
SKIP = {"data", "step", "tokens", "lr", "step_s", "skipped_updates", "rollout_tokens_per_s", "turns_mean", "invalid_rate", "grad_norm"}
# panels that summarize the step's episodes: on a step trained on demonstrations ("data":
# "demonstrations" in metrics.jsonl) those are the expert's episodes, not the policy's
EPISODE_PANELS = {"success_rate", "return_mean"}
DEMOS = " (demonstrations, not the policy)"


@dataclass(frozen=True)
class Series:
    run: int  # index of the run in the list given: its colour in every panel
    label: str
    points: list[tuple[int, float]]
    demonstrations: bool = False


def _points(rows: list[dict], key: str) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]


def panels(run_dirs: list[Path]) -> dict[str, list[Series]]:
    """Panel -> the series drawn in it, each tagged with its run."""
    runs = [(Path(d), read_records(run_files.metrics_file(d)), read_records(run_files.eval_file(d))) for d in run_dirs]
    extra = sorted({k for _, rows, _ in runs for row in rows for k in row} - SKIP - set(BASE))
    out: dict[str, list[Series]] = {}
    for panel in [*BASE, "eval success_rate", *extra]:
        out[panel] = []
        for index, (run_dir, metrics, evals) in enumerate(runs):
            name = _name(run_dir, run_dirs)
            if panel == "eval success_rate":
                groups = [(name, _points(evals, "success_rate"), False)]
            elif panel in EPISODE_PANELS:
                demo_rows = [r for r in metrics if r.get("data") == "demonstrations"]
                policy_rows = [r for r in metrics if r.get("data") != "demonstrations"]
                groups = [(name, _points(policy_rows, panel), False), (name + DEMOS, _points(demo_rows, panel), True)]
            else:
                groups = [(name, _points(metrics, panel), False)]
            out[panel] += [Series(index, label, points, demos) for label, points, demos in groups if points]
    return out


def series(run_dirs: list[Path]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Panel -> series label -> (step, value) points: what ``plot_runs`` draws."""
    return {panel: {s.label: s.points for s in drawn} for panel, drawn in panels(run_dirs).items()}


def _name(run_dir: Path, run_dirs: list[Path]) -> str:
    """The run's folder name, or its path when two runs share a name."""
    names = [Path(d).name for d in run_dirs]
    return run_dir.name if names.count(run_dir.name) == 1 else str(run_dir)


def plot_runs(run_dirs: list[Path], out: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, data = figure(run_dirs)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    drawn = {panel: {s.label: len(s.points) for s in runs} for panel, runs in data.items()}
    fig.savefig(out, dpi=80, metadata={"Description": json.dumps(drawn)})
    plt.close(fig)
    return out


def figure(run_dirs: list[Path]):
    """The matplotlib figure ``plot_runs`` saves, and the series in each panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agentkit.core.errors import ConfigError

    for d in run_dirs:
        if not run_files.metrics_file(d).exists():
            raise ConfigError(f"{d} has no metrics.jsonl: give run folders written by `agentkit train`.")
    data = panels([Path(d) for d in run_dirs])
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    names = list(data)
    cols = 3
    rows_n = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(5 * cols, 3.2 * rows_n), squeeze=False)
    for ax, panel in zip(axes.flat, names, strict=False):
        for drawn in data[panel]:
            style = ({"linestyle": ":", "marker": "x", "alpha": 0.6} if drawn.demonstrations
                     else {"marker": "o" if len(drawn.points) < 30 else None})
            ax.plot(*zip(*drawn.points, strict=True), color=colours[drawn.run % len(colours)], label=drawn.label, **style)
        ax.set_title(panel)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    # one legend for the figure: a run's colour is the same in every panel
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colours[index % len(colours)], marker="o", label=_name(Path(d), run_dirs))
               for index, d in enumerate(run_dirs)]
    if any(s.demonstrations for runs in data.values() for s in runs):
        handles.append(Line2D([], [], color="grey", linestyle=":", marker="x", label="dotted: steps trained on "
                              "demonstrations\n(the expert's episodes, not the policy's)"))
    axes.flat[0].legend(handles=handles, fontsize=8)
    fig.tight_layout()
    return fig, data
