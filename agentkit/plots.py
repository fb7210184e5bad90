"""Training curves as a PNG: success rate, return, loss, eval success and the objective's metrics."""

from __future__ import annotations

import json
from pathlib import Path

BASE = ["success_rate", "return_mean", "loss"]
SKIP = {"data", "step", "tokens", "lr", "step_s", "skipped_updates", "rollout_tokens_per_s", "turns_mean", "invalid_rate", "grad_norm"}


def _read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_runs(run_dirs: list[Path], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(Path(d), _read(Path(d) / "metrics.jsonl"), _read(Path(d) / "eval.jsonl")) for d in run_dirs]
    extra = sorted({k for _, rows, _ in runs for row in rows for k in row} - SKIP - set(BASE))
    panels = [*BASE, "eval success_rate", *extra]
    cols = 3
    rows_n = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(5 * cols, 3.2 * rows_n), squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        for run_dir, metrics, evals in runs:
            source, key = (evals, "success_rate") if panel == "eval success_rate" else (metrics, panel)
            points = [(r["step"], r[key]) for r in source if isinstance(r.get(key), (int, float))]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o" if len(points) < 30 else None, label=run_dir.name)
        ax.set_title(panel)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out
