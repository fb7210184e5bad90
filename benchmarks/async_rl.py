"""Sync versus async training on one machine with the same cores: wall time, idle shares, learning.

    python benchmarks/async_rl.py --envs textworld/coin-v0 alfworld --seeds 0 1 2 --steps 8

Each (environment, seed) trains twice with ``agentkit train`` from the same model on the same
tasks and sampling seeds, alternating the two modes so machine noise hits both:

- sync: rollout then update, each phase with every core (torch's default threads);
- async (``--async --max-staleness 1``): the generator process with half the cores plays step k+1
  while the trainer, with the other half, updates on step k.

Both recompute pi_old with the trainer (``train.old_logprobs=trainer``), so the two runs differ
only in when episodes are played and by which weights. Figures: the median step time over the
steps that neither start nor end the run (the first loads models and the last evaluates and
checkpoints), the shares of a step each side sat idle (sync: the trainer idles while generating
and the generator while updating; async: the trainer's wait for trajectories, the generator's
wait for admission), and learning at equal samples: the success of the training episodes over
the run and the final greedy evaluation, each with a 95% Wilson interval over episodes pooled
across seeds, and the paired async - sync difference of the final evaluation over tasks.

From the measured phase times, ``expected speedup = (G + U) / max(G, U)`` estimates what the
overlap gives when generation (G) and update (U) run on their own devices at the same speeds
(a model, stated as an estimate, not a measurement).

Writes ``benchmarks/results/async_rl.json``, ``.md`` and ``.png`` (the training-success curves of
both modes; ``--replot`` redraws it from the JSON), and ``--out``'s run folders.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

from agentkit.core import runs
from agentkit.core.evalstats import wilson

HERE = Path(__file__).resolve().parent


def train(out: Path, env: str, seed: int, steps: int, mode: str, args) -> dict:
    command = [sys.executable, "-m", "agentkit.cli", "train", "--env", env, "--out", str(out), "--steps", str(steps),
               "--seed", str(seed), "--quiet", "--eval-every", "0", "--eval-episodes", str(args.eval_episodes),
               "--tasks-per-step", str(args.tasks), "--group-size", str(args.group), "--checkpoint-every", "0",
               "--set", "train.old_logprobs=trainer", "--set", "log.signal_episodes=0"]
    if args.max_turns:
        command += ["--max-turns", str(args.max_turns)]
    if mode == "async":
        command += ["--async", "--max-staleness", str(args.staleness),
                    "--set", f"async_rl.generator_threads={args.generator_threads}",
                    "--set", f"async_rl.trainer_threads={args.trainer_threads}"]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise SystemExit(f"{mode} run on {env} failed:\n{result.stderr[-3000:]}")
    wall = time.perf_counter() - started
    metrics = [json.loads(line) for line in runs.metrics_file(out).read_text().splitlines()]
    final = json.loads(runs.eval_file(out).read_text().splitlines()[-1])
    from agentkit.core.jsonl import read_trajectories

    trained = [t for s in range(1, steps + 1) for t in read_trajectories(runs.trajectory_file(out, s))]
    middle = metrics[1:-1] or metrics
    step_s = statistics.median(m["step_s"] for m in middle)
    if mode == "sync":
        trainer_idle = statistics.median(m["collect_s"] / m["step_s"] for m in middle)
        generator_idle = statistics.median(1 - m["collect_s"] / m["step_s"] for m in middle)
    else:
        trainer_idle = statistics.median(m["trainer_wait_s"] / m["step_s"] for m in middle)
        generator_idle = statistics.median(m["generator_wait_s"] / max(1e-9, m["generator_wait_s"] + m["generator_play_s"])
                                           for m in middle)
    return {"env": env, "seed": seed, "mode": mode, "wall_s": wall, "step_s": step_s,
            "collect_s": statistics.median(m["collect_s"] for m in middle),
            "update_s": statistics.median(m["update_s"] for m in middle),
            "generator_play_s": statistics.median(m.get("generator_play_s", m["collect_s"]) for m in middle),
            "trainer_idle": trainer_idle, "generator_idle": generator_idle,
            "train_success": [m["success_rate"] for m in metrics],
            "train_won": sum(t.won for t in trained), "train_episodes": len(trained),
            "eval_won": round(final["success_rate"] * final["episodes"]), "eval_episodes": final["episodes"],
            "staleness_mean": statistics.mean(m.get("staleness_mean", 0.0) for m in metrics),
            "mismatch_kl": max(m.get("mismatch_kl", 0.0) for m in metrics)}


def summarize(runs: list[dict]) -> list[dict]:
    rows = []
    for env in dict.fromkeys(r["env"] for r in runs):
        by_mode = {mode: [r for r in runs if r["env"] == env and r["mode"] == mode] for mode in ("sync", "async")}
        row = {"env": env}
        for mode, group in by_mode.items():
            won, n = sum(r["train_won"] for r in group), sum(r["train_episodes"] for r in group)
            ewon, en = sum(r["eval_won"] for r in group), sum(r["eval_episodes"] for r in group)
            row[mode] = {"step_s": statistics.median(r["step_s"] for r in group),
                         "step_s_range": [min(r["step_s"] for r in group), max(r["step_s"] for r in group)],
                         "trainer_idle": statistics.median(r["trainer_idle"] for r in group),
                         "generator_idle": statistics.median(r["generator_idle"] for r in group),
                         "collect_s": statistics.median(r["collect_s"] for r in group),
                         "update_s": statistics.median(r["update_s"] for r in group),
                         "train_success": won / n, "train_ci": wilson(won, n),
                         "eval_success": ewon / en, "eval_ci": wilson(ewon, en)}
        sync = row["sync"]
        g, u = sync["collect_s"], sync["update_s"]
        row["speedup"] = sync["step_s"] / row["async"]["step_s"]
        row["expected_speedup_separate_devices"] = (g + u) / max(g, u)
        diffs = [a["eval_won"] / a["eval_episodes"] - s["eval_won"] / s["eval_episodes"]
                 for s, a in zip(by_mode["sync"], by_mode["async"], strict=True)]
        row["eval_diff_per_seed"] = diffs
        rows.append(row)
    return rows


def markdown(rows: list[dict], args) -> str:
    lines = [f"Measured {date.today()} on {platform.machine()} ({platform.processor() or 'cpu'}), 2 cores; "
             f"{args.tasks} tasks x {args.group} episodes per step, {args.steps} steps, seeds {args.seeds}, "
             f"async max_staleness {args.staleness}.", "",
             "| env | mode | step s (median, min-max over seeds) | trainer idle | generator idle | train success [95% CI] | "
             "final eval [95% CI] |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        for mode in ("sync", "async"):
            m = row[mode]
            lines.append(f"| {row['env']} | {mode} | {m['step_s']:.2f} ({m['step_s_range'][0]:.2f}-{m['step_s_range'][1]:.2f}) | "
                         f"{m['trainer_idle']:.0%} | {m['generator_idle']:.0%} | {m['train_success']:.1%} "
                         f"[{m['train_ci'][0]:.1%}, {m['train_ci'][1]:.1%}] | {m['eval_success']:.1%} "
                         f"[{m['eval_ci'][0]:.1%}, {m['eval_ci'][1]:.1%}] |")
    lines += ["", "| env | measured speedup (sync step / async step) | G (sync collect s) | U (sync update s) | "
              "estimate on separate devices (G+U)/max(G,U) |", "|---|---|---|---|---|"]
    for row in rows:
        s = row["sync"]
        lines.append(f"| {row['env']} | {row['speedup']:.2f}x | {s['collect_s']:.2f} | {s['update_s']:.2f} | "
                     f"{row['expected_speedup_separate_devices']:.2f}x |")
    return "\n".join(lines) + "\n"


def plot(runs: list[dict], path: Path) -> None:
    """Training success per step (mean over seeds, min-max band) of each mode, per environment."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(dict.fromkeys(r["env"] for r in runs))
    fig, axes = plt.subplots(1, len(envs), figsize=(5 * len(envs), 3.5), squeeze=False)
    for ax, env in zip(axes[0], envs, strict=True):
        for mode, colour in (("sync", "tab:blue"), ("async", "tab:orange")):
            curves = [r["train_success"] for r in runs if r["env"] == env and r["mode"] == mode]
            steps = range(1, len(curves[0]) + 1)
            by_step = list(zip(*curves, strict=True))
            ax.plot(steps, [statistics.mean(v) for v in by_step], color=colour, label=f"{mode} ({len(curves)} seeds)")
            ax.fill_between(steps, [min(v) for v in by_step], [max(v) for v in by_step], color=colour, alpha=0.2)
        ax.set(title=env, xlabel="step (equal samples per step)", ylabel="training success", ylim=(0, 1))
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["textworld/coin-v0", "alfworld"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=0, help="0: the environment's own limit")
    parser.add_argument("--staleness", type=int, default=1)
    parser.add_argument("--eval-episodes", type=int, default=16)
    parser.add_argument("--generator-threads", type=int, default=0, help="async: 0 = half the cores")
    parser.add_argument("--trainer-threads", type=int, default=0, help="async: 0 = the cores the generator leaves")
    parser.add_argument("--out", type=Path, default=Path("runs/async_bench"))
    parser.add_argument("--results", type=Path, default=HERE / "results" / "async_rl")
    parser.add_argument("--replot", action="store_true", help="only redraw the figure from --results' JSON")
    args = parser.parse_args()
    if args.replot:
        plot(json.loads(args.results.with_suffix(".json").read_text())["runs"], args.results.with_suffix(".png"))
        return
    runs = []
    for env in args.envs:
        for seed in args.seeds:
            modes = ("sync", "async") if seed % 2 == 0 else ("async", "sync")
            for mode in modes:
                out = args.out / env.replace("/", "_") / f"{mode}-{seed}"
                if out.exists():
                    import shutil

                    shutil.rmtree(out)
                runs.append(train(out, env, seed, args.steps, mode, args))
                r = runs[-1]
                print(f"{env} seed {seed} {mode}: step {r['step_s']:.2f}s, trainer idle {r['trainer_idle']:.0%}, "
                      f"generator idle {r['generator_idle']:.0%}, train success {r['train_won']}/{r['train_episodes']}, "
                      f"eval {r['eval_won']}/{r['eval_episodes']}", flush=True)
    rows = summarize(runs)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.with_suffix(".json").write_text(json.dumps({"runs": runs, "summary": rows}, indent=1))
    text = markdown(rows, args)
    args.results.with_suffix(".md").write_text(text)
    plot(runs, args.results.with_suffix(".png"))
    print(text)


if __name__ == "__main__":
    main()
