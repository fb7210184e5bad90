"""Training curves as a PNG: success rate, return, loss, eval success and the objective's metrics.

Several runs are overlaid, one line per run in every panel. The PNG records what it drew in its
``Description`` text chunk (JSON: panel -> run -> number of points), so a test or a script can
check the series without reading pixels.
"""

from __future__ import annotations

import json
from pathlib import Path

BASE = ["success_rate", "return_mean", "loss"]
SKIP = {"data", "step", "tokens", "lr", "step_s", "skipped_updates", "rollout_tokens_per_s", "turns_mean", "invalid_rate", "grad_norm"}


def _read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def series(run_dirs: list[Path]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Panel -> run name -> (step, value) points: what ``plot_runs`` draws."""
    runs = [(Path(d), _read(Path(d) / "metrics.jsonl"), _read(Path(d) / "eval.jsonl")) for d in run_dirs]
    extra = sorted({k for _, rows, _ in runs for row in rows for k in row} - SKIP - set(BASE))
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for panel in [*BASE, "eval success_rate", *extra]:
        out[panel] = {}
        for run_dir, metrics, evals in runs:
            source, key = (evals, "success_rate") if panel == "eval success_rate" else (metrics, panel)
            points = [(r["step"], r[key]) for r in source
                      if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
            if points:
                out[panel][_name(run_dir, run_dirs)] = points
    return out


def _name(run_dir: Path, run_dirs: list[Path]) -> str:
    """The run's folder name, or its path when two runs share a name."""
    names = [Path(d).name for d in run_dirs]
    return run_dir.name if names.count(run_dir.name) == 1 else str(run_dir)


def plot_runs(run_dirs: list[Path], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agentkit.core.errors import ConfigError

    for d in run_dirs:
        if not (Path(d) / "metrics.jsonl").exists():
            raise ConfigError(f"{d} has no metrics.jsonl: give run folders written by `agentkit train`.")
    data = series([Path(d) for d in run_dirs])
    panels = list(data)
    cols = 3
    rows_n = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(5 * cols, 3.2 * rows_n), squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        for name, points in data[panel].items():
            ax.plot(*zip(*points, strict=True), marker="o" if len(points) < 30 else None, label=name)
        ax.set_title(panel)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    drawn = {panel: {name: len(points) for name, points in runs.items()} for panel, runs in data.items()}
    fig.savefig(out, dpi=80, metadata={"Description": json.dumps(drawn)})
    plt.close(fig)
    return out
