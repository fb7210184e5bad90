"""The nano_repro report: tables, curves and a discussion, all computed from ``results.json``.

Every number in the report comes from the results; the discussion's verdicts are rules applied to
them (``verdicts``), so a rerun with other outcomes says other things. A difference counts only when
the two means are further apart than the larger of their two standard deviations over seeds (with
one seed: never "beats", only "ahead").
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

SELF_DISTILL = ("grpo", "grpo_opsd", "opsd", "skill_sd", "rlsd", "sdar-ucb", "sdar-keyword", "sdar-full", "sdar-random")
DISTILL = ("opd", "sage_opd")


def _mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _pct(mean: float, std: float) -> str:
    return "—" if mean != mean else f"{mean:.1%} ± {std:.1%}"


def variant_stats(env: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per variant: for each eval split, success mean/std over seeds and turns per solved episode."""
    splits = env["setup"]["eval_splits"]
    out: dict[str, dict[str, Any]] = {}
    for variant in sorted({r["variant"] for r in env["runs"]}, key=_order):
        runs = [r for r in env["runs"] if r["variant"] == variant]
        row: dict[str, Any] = {"seeds": len(runs)}
        for split in splits:
            row[split] = _mean_std([r["eval"][split]["success_rate"] for r in runs])
            turns = [r["eval"][split]["turns_per_solved"] for r in runs if r["eval"][split]["turns_per_solved"]]
            row[f"{split}_turns"] = statistics.fmean(turns) if turns else None
        row["diagnostics"] = {k: statistics.fmean(r["diagnostics"][k] for r in runs if k in r["diagnostics"])
                              for k in {k for r in runs for k in r["diagnostics"]}}
        row["curve"] = _mean_curve(runs)
        row["train_s"] = statistics.fmean(r["train_s"] for r in runs)
        out[variant] = row
    return out


def _order(variant: str) -> int:
    order = [*SELF_DISTILL, *DISTILL]
    return order.index(variant) if variant in order else len(order)


def _mean_curve(runs: list[dict[str, Any]]) -> list[tuple[int, float]]:
    steps = sorted({p["step"] for r in runs for p in r["curve"]})
    curve = []
    for step in steps:
        values = [p["success_rate"] for r in runs for p in r["curve"] if p["step"] == step]
        if len(values) == len(runs):
            curve.append((step, statistics.fmean(values)))
    return curve


def _prep_times(times: dict[str, float]) -> str:
    names = {"demos": "demonstrations", "sft": "SFT", "stage_eval": "stage evaluations"}
    timed = [f"{names[k]} {times[k] / 60:.1f} min" for k in names if k in times]
    untimed = [names[k] for k in names if k not in times]
    return ("before them: " + ", ".join(timed) + ("; " if timed and untimed else "")
            + (f"not timed by this grid (built earlier, reused): {', '.join(untimed)}" if untimed else "") + ".")


def compare(stats: dict[str, Any], a: str, b: str, split: str) -> str | None:
    """'beats', 'ahead' (within noise), 'tied', 'behind' or 'loses' for a vs b; None if either is missing."""
    if a not in stats or b not in stats:
        return None
    (ma, sa), (mb, sb) = stats[a][split], stats[b][split]
    noise = max(sa, sb)
    if ma == mb:
        return "tied"
    separated = abs(ma - mb) > noise and min(stats[a]["seeds"], stats[b]["seeds"]) > 1
    if ma > mb:
        return "beats" if separated else "ahead (within noise)"
    return "loses to" if separated else "behind (within noise)"


def saturation(curve: list[tuple[int, float]]) -> tuple[float, float] | None:
    """(gain over the first half of training, gain over the second half) of a mean curve."""
    if len(curve) < 3:
        return None
    mid = (len(curve) - 1) // 2
    return curve[mid][1] - curve[0][1], curve[-1][1] - curve[mid][1]


def verdicts(env_name: str, env: dict[str, Any], stats: dict[str, Any]) -> list[str]:
    split = env["setup"]["eval_splits"][0]
    lines = []
    sft = env["stages"]["sft"][split]["success_rate"] if env.get("stages") else None
    if env.get("stages") and all(v["success_rate"] == 0 for v in env["stages"]["sft"].values()):
        lines.append("- The SFT policy wins no evaluation game: RL starts at the floor, where group-relative "
                     "advantages are zero unless a sampled episode happens to win. Claims judged here are judged "
                     "at the floor.")

    def say(claim: str, a: str, b: str) -> None:
        verdict = compare(stats, a, b, split)
        if verdict is None:
            lines.append(f"- {claim}: not measured ({a} or {b} did not run).")
            return
        holds = verdict == "beats"
        floor = stats[a][split][0] == 0 and stats[b][split][0] == 0
        outcome = "untestable here (both at 0)" if floor else "reproduced" if holds else "not reproduced"
        lines.append(f"- {claim}: {a} {_pct(*stats[a][split])} vs {b} {_pct(*stats[b][split])} -> {a} {verdict} {b}: "
                     f"**{outcome}**.")

    say("SDAR beats GRPO (UCB retrieval)", "sdar-ucb", "grpo")
    say("SDAR beats GRPO even with random retrieval", "sdar-random", "grpo")
    for unstable in ("grpo_opsd", "opsd"):
        if unstable in stats and sft is not None:
            mean = stats[unstable][split][0]
            lost = sft - mean
            kind = "collapse" if unstable == "opsd" else "instability"
            spread = (f"; seed spread {stats[unstable][split][1]:.1%} vs GRPO's {stats['grpo'][split][1]:.1%}"
                      if "grpo" in stats else "")
            lines.append(f"- {unstable} {kind}: eval success {mean:.1%} vs the SFT start {sft:.1%} "
                         f"({mean - sft:+.1%}); "
                         + ("**reproduced** (it ends below where it started)" if lost > 0 else
                            "**untestable here** (it starts at 0)" if sft == 0 else "**not reproduced**")
                         + (f"; vs GRPO: {compare(stats, unstable, 'grpo', split)}" if "grpo" in stats else "")
                         + spread + ".")
    say("SAGE-OPD beats OPD", "sage_opd", "opd")
    for variant in DISTILL:
        if variant in stats:
            gains = saturation(stats[variant]["curve"])
            if gains:
                lines.append(f"- {variant} curve ({split}, mean over seeds): first-half gain {gains[0]:+.1%}, "
                             f"second-half gain {gains[1]:+.1%}.")
    if "opd" in stats and "sage_opd" in stats:
        g_opd, g_sage = saturation(stats["opd"]["curve"]), saturation(stats["sage_opd"]["curve"])
        if g_opd and g_sage:
            holds = g_opd[1] <= 0 < g_sage[1]
            lines.append(f"- OPD saturates early while SAGE-OPD keeps improving (OPD's second-half gain <= 0 < "
                         f"SAGE-OPD's): **{'reproduced' if holds else 'not reproduced'}**.")
    return [f"**{env_name}** (claims judged on split `{split}`):", *lines]


def plot_curves(env_name: str, env: dict[str, Any], stats: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    sft = env["stages"]["sft"][env["setup"]["eval_splits"][0]]["success_rate"] if env.get("stages") else None
    for ax, group, title in ((axes[0], SELF_DISTILL, "GRPO and self-distillation"), (axes[1], DISTILL, "OPD vs SAGE-OPD")):
        for variant in group:
            if variant in stats and stats[variant]["curve"]:
                steps, values = zip(*stats[variant]["curve"], strict=True)
                ax.plot(steps, values, marker="o", label=f"{variant} (n={stats[variant]['seeds']})")
        if sft is not None:
            ax.axhline(sft, color="grey", linestyle=":", label=f"SFT start ({env['setup']['eval_episodes']} games)")
        ax.set_title(f"{env_name}: {title}")
        ax.set_xlabel("RL step")
        ax.legend(fontsize=7)
    axes[0].set_ylabel(f"greedy success, {env['setup']['eval_splits'][0]} ({env['setup']['curve_episodes']} games)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


SUPERSEDED = ("> **Superseded.** This grid predates the baselines' alignment with their reference code and the positive "
              "controls of `examples/vaults_bench` (no run here was shown to improve its policy first); it is kept as it "
              "was reported, not as today's result.\n")


def write_report(results: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    stem = path.stem
    lines = [
        "# Nano-scale reproduction of the seeds' claims",
        "",
        SUPERSEDED,
        "Generated by `examples/nano_repro/run.py` from its `results.json`; nothing here is typed by hand.",
        f"Command: `{results['command']}`" + ("  (**--quick: test budgets, the numbers mean nothing**)" if results["quick"] else ""),
        "",
    ]
    expected = len(results["seeds"]) * len(results["variants"])
    discussion = []
    for env_name, env in results["envs"].items():
        setup = env["setup"]
        stats = variant_stats(env)
        splits = setup["eval_splits"]
        done = len(env["runs"])
        lines += [f"## {env_name}: `{setup['env_id']}` {setup['kwargs']}", ""]
        lines.append(f"Runs finished: {done} of {expected}" + ("" if done == expected else " (**partial grid**: rows "
                                                                 "average the seeds that finished, column n)") + ".")
        missing = [v for v in results["variants"] if v not in stats]
        if missing:
            lines.append(f"Not run at all (cut to fit the time): {', '.join(missing)}.")
        lines.append(f"Budget per RL run: {setup['rl_steps']} steps x {setup['tasks_per_step']} tasks x "
                     f"{setup['group_size']} samples = {setup['rl_steps'] * setup['tasks_per_step'] * setup['group_size']} "
                     f"episodes, max {setup['max_turns']} turns, lr 2e-4. Final evaluation: greedy, "
                     f"{setup['eval_episodes']} held-out games per split ({', '.join(splits)}); curves: "
                     f"{setup['curve_episodes']} games of `{splits[0]}` every {setup['eval_every']} steps.")
        if env["runs"]:
            total = sum(r["wall_s"] for r in env["runs"])
            lines.append(f"Time: the {len(env['runs'])} RL runs took {total / 60:.0f} process-minutes (training and "
                         f"final evaluation, one thread each), {total / 120:.0f} min of wall time at `--jobs 2` on 2 cores; "
                         + _prep_times(env.get("prep_times") or {}))
        lines.append("")
        if env.get("stages"):
            st = env["stages"]
            lines += ["| stage | " + " | ".join(f"success `{s}`" for s in splits) + " |",
                      "|---|" + "---:|" * len(splits)]
            for stage in [s for s in ("init", "sft", "teacher") if s in st]:  # "teacher": older results
                label = {"init": "random init", "sft": "SFT (start of every RL run)",
                         "teacher": "OPD/SAGE-OPD teacher (longer SFT)"}[stage]
                lines.append(f"| {label} | " + " | ".join(f"{st[stage][s]['success_rate']:.1%}" for s in splits) + " |")
            hu = st["hint_use"]
            uses = hu["logprob_with"] - hu["logprob_without"]
            # informative: whole actions (what the policy plays) agree with the expert more often with the block;
            # older results without that measure: the log-prob gain
            informative = (hu["action_top1_with"] - hu["action_top1_without"] > 0.05 if "action_top1_with" in hu
                           else uses > 0.05)
            lines += ["", f"SFT data: {setup['plain_demos']} plain expert games and {setup['hinted_demos']} other games "
                      "whose prompt starts with the privileged block exactly as the self-teacher renders it (3 random "
                      "skills of the starter bank + the environment's expert plan) and whose actions follow the plan. "
                      f"SFT: {setup['sft_steps']} steps. "
                      + (f"OPD's and SAGE-OPD's teacher: a separate SFT on {setup.get('teacher_demos')} plain games for "
                         f"{setup.get('teacher_steps')} steps, no privileged block." if "teacher" in st else
                         "OPD's and SAGE-OPD's teacher is this SFT policy, frozen, shown the privileged block (the "
                         "self-distillation objectives' teacher is the *current* policy with the same block)."), "",
                      f"Does the SFT policy use the privileged block? On {hu['episodes']} held-out expert games "
                      f"(`{splits[0]}`), the expert's tokens: mean log-prob {hu['logprob_without']:.3f} without the "
                      f"block -> {hu['logprob_with']:.3f} with it ({uses:+.3f} nats/token); policy's top-1 on "
                      f"{hu['top1_without']:.1%} -> {hu['top1_with']:.1%} of them"
                      + (f"; whole actions that are the policy's greedy choice: {hu['action_top1_without']:.1%} -> "
                         f"{hu['action_top1_with']:.1%}" if "action_top1_with" in hu else "") + ". "
                      + ("**The block is informative to the policy**: with it the self-teacher puts more mass on the "
                         "expert's actions than the student does." if informative else
                         "**The policy does not act on the block**: with it, the expert's actions are not (or hardly) "
                         "more often its choice, so a self-teacher scores about as the student does."),
                      ""]
        header = ["objective", "n"] + [f"success `{s}`" for s in splits] + [f"turns/solved `{s}`" for s in splits] + [
            "train s/run"]
        lines += ["| " + " | ".join(header) + " |", "|---|---:|" + "---:|" * (2 * len(splits) + 1)]
        for variant, row in stats.items():
            cells = [variant, str(row["seeds"])] + [_pct(*row[s]) for s in splits] + [
                f"{row[f'{s}_turns']:.2f}" if row[f"{s}_turns"] else "—" for s in splits] + [f"{row['train_s']:.0f}"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        diag_rows = [(v, r["diagnostics"]) for v, r in stats.items() if r["diagnostics"]]
        gate = [(v, d) for v, d in diag_rows if "gate_mean" in d]
        if gate:
            lines += ["Gate diagnostics (mean over steps and seeds; gap = logT - logS per response token):", "",
                      "| objective | gate mean | gate > 0.5 | gap mean | negative-gap share |", "|---|---:|---:|---:|---:|"]
            for v, d in gate:
                lines.append(f"| {v} | {d['gate_mean']:.3f} | {d.get('gate_above_half', float('nan')):.1%} | "
                             f"{d.get('gap_mean', float('nan')):.3f} | {d.get('negative_gap_share', float('nan')):.1%} |")
            lines.append("")
        judge = [(v, d) for v, d in diag_rows if "judge_skip_share" in d]
        if judge:
            lines += ["Turn-label diagnostics of SAGE-OPD (oracle judge; mean over steps and seeds):", "",
                      "| objective | skip | weak | strong | decided by the check | confidence mean | Z |",
                      "|---|---:|---:|---:|---:|---:|---:|"]
            for v, d in judge:
                lines.append(f"| {v} | {d['judge_skip_share']:.1%} | {d['judge_weak_share']:.1%} | "
                             f"{d['judge_strong_share']:.1%} | {d['judge_check_share']:.1%} | "
                             f"{d['confidence_mean']:.3f} | {d['Z']:.2f} |")
            lines.append("")
        if stats and env.get("stages"):
            png = path.with_name(f"{stem}_{env_name}.png")
            plot_curves(env_name, env, stats, png)
            lines += [f"![{env_name} curves]({png.name})", ""]
            discussion += verdicts(env_name, env, stats) + [""]
    settings = []
    for env_name, env in results["envs"].items():
        if env["setup"]["kwargs"].get("goal") == "brief":
            from agentkit.envs.textworld_env import BRIEF_COIN_GOAL

            settings.append(f"- {env_name}: `goal=brief` replaces the instruction that spells out the route with "
                            f"\"{BRIEF_COIN_GOAL}\"" + (", and distractor rooms are on (level > 100)"
                                                            if env["setup"]["kwargs"].get("level", 0) > 100 else "")
                            + ": the student has to find the way, the privileged expert plan knows it.")
        if env["setup"].get("context", "chat") == "window":
            settings.append(f"- {env_name}: window context (the last {env['setup']['window']} turns in each prompt).")
    lines += ["## Caveats (read before the verdicts)", "", *settings,
              "- Nano scale: a 0.22M-parameter policy, a few hundred rollout episodes per run, and evaluations on a few "
              "dozen games, where one game is several points of success rate. Differences smaller than the seed spread "
              "are noise, and the rule below treats them so.",
              "- Objective settings are the objectives' defaults (the papers' reference values, e.g. SDAR lambda 0.01, "
              "beta 5, next to a GRPO term of weight 1), not tuned for this scale.",
              "- SAGE-OPD's judge is the oracle (the environment's expert action), not the teacher: a tiny teacher "
              "cannot write a label. The teacher's confidence weighting and Z normalization are the paper's.",
              "- A row with n below the number of seeds is a partial grid (see 'Runs finished').",
              "",
              "## Which claims reproduced", "",
              "Rule: *beats* = the mean is higher by more than the larger seed standard deviation of the two "
              "(with at least 2 seeds each); anything closer is reported as within noise and counts as not reproduced.",
              "", *discussion]
    path.write_text("\n".join(lines) + "\n")
