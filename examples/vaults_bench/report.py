"""The vaults benchmark's report, regenerated from ``results.json`` (nothing typed by hand)."""

from __future__ import annotations

import random
import statistics
from pathlib import Path
from typing import Any

BOOTSTRAP = 2000
NON_INFERIORITY = 0.05  # a ">=" claim holds when the interval's lower end is above -5 points
# (name, arm A, arm B, direction, A's evaluation, B's evaluation); "start" = the SFT policy
CLAIMS = [
    ("control: GRPO > its SFT start (the grid's budget learns)", "grpo", "start", ">", "test", "test"),
    ("control: OPD > its SFT start", "opd", "start", ">", "test", "test"),
    ("SDAR > GRPO", "sdar", "grpo", ">", "test", "test"),
    ("SDAR with random retrieval >= GRPO", "sdar-random", "grpo", ">=", "test", "test"),
    ("SDAR > SDAR with random retrieval (the right skill matters)", "sdar", "sdar-random", ">", "test", "test"),
    ("reference GRPO+OPSD (SDAR, beta 0) vs GRPO", "grpo_opsd", "grpo", ">", "test", "test"),
    ("pure OPSD collapses: below its SFT start", "opsd", "start", "<", "test", "test"),
    ("SDAR without skills >= Skill-GRPO with skills (internalization)", "sdar", "skill_grpo", ">=", "test",
     "test_with_skills"),
    ("SDAR without skills > Skill-GRPO without skills", "sdar", "skill_grpo", ">", "test", "test"),
    ("SAGE-OPD > OPD", "sage_opd", "opd", ">", "test", "test"),
    ("SAGE-OPD > OPD, both with the papers' sampled estimator", "sage_opd-sampled", "opd-sampled", ">", "test", "test"),
    ("SAGE-OPD > its ablation s_t = i_t", "sage_opd", "sage_opd-s=i", ">", "test", "test"),
    ("SAGE-OPD > its ablation without Z", "sage_opd", "sage_opd-noZ", ">", "test", "test"),
]


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def pts(x: float) -> str:
    return f"{100 * x:+.1f}"


def by_arm(main: list[dict[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    arms: dict[str, dict[int, dict[str, Any]]] = {}
    for r in main:
        arms.setdefault(r["arm"], {})[r["seed"]] = r
    return arms


def games_of(arms, start: list[int] | None, arm: str, key: str) -> dict[int, list[int]]:
    """seed -> per-game 0/1 on test (``start``: the SFT policy, the same games for every seed)."""
    if arm == "start":
        seeds = {s for runs in arms.values() for s in runs}
        return {s: start for s in seeds} if start else {}
    return {s: r[key] for s, r in arms.get(arm, {}).items() if key in r}


def paired_bootstrap(a: dict[int, list[int]], b: dict[int, list[int]], rng: random.Random) -> dict[str, float] | None:
    """Mean difference a - b over the seeds both have and their games, with a 95% interval from
    resampling seeds and games (paired: the same seeds and games on both sides)."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    n = min(len(a[s]) for s in seeds)
    diff = [[a[s][g] - b[s][g] for g in range(n)] for s in seeds]  # [S, G]
    point = statistics.fmean(x for row in diff for x in row)
    draws = []
    for _ in range(BOOTSTRAP):
        rows = [diff[rng.randrange(len(seeds))] for _ in seeds]
        games = [rng.randrange(n) for _ in range(n)]
        draws.append(statistics.fmean(row[g] for row in rows for g in games))
    draws.sort()
    se = statistics.pstdev(draws)
    return {"diff": point, "low": draws[int(0.025 * BOOTSTRAP)], "high": draws[int(0.975 * BOOTSTRAP) - 1],
            "mde": 2.8 * se, "seeds": len(seeds), "games": n}


def verdict(stat: dict[str, float], direction: str) -> str:
    if direction == ">":
        return "**reproduced**" if stat["low"] > 0 else "not reproduced"
    if direction == "<":
        return "**reproduced**" if stat["high"] < 0 else "not reproduced"
    return "**reproduced** (non-inferior)" if stat["low"] > -NON_INFERIORITY else "not reproduced"


def claim_row(name: str, stat: dict[str, float], direction: str) -> str:
    """A claim table's row: A - B, its interval, MDE, seeds x games, the verdict."""
    return (f"| {name} | {pts(stat['diff'])} | [{pts(stat['low'])}, {pts(stat['high'])}] | "
            f"{100 * stat['mde']:.1f} | {stat['seeds']} x {stat['games']} | {verdict(stat, direction)} |")


def sweep_noise(runs: list[dict[str, Any]], games: int) -> float:
    """Half-width of a 95% interval for the difference of two final dev rates at the sweep's mean rate."""
    finals = [r["curve"][-1]["success_rate"] for r in runs if r["curve"]]
    p = statistics.fmean(finals) if finals else 0.5
    return 1.96 * (2 * p * (1 - p) / games) ** 0.5


def curve_text(run: dict[str, Any]) -> str:
    return ", ".join(f"{p['step']}: {pct(p['success_rate'])}" for p in run["curve"]) or "-"


def late_gain(run: dict[str, Any]) -> float | None:
    """Dev success at the last checkpoint minus at the middle one: still improving?"""
    curve = run.get("curve") or []
    if len(curve) < 3:
        return None
    return curve[-1]["success_rate"] - curve[len(curve) // 2]["success_rate"]


def plot(arms, groups: dict[str, list[str]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4), squeeze=False)
    for ax, (title, names) in zip(axes[0], groups.items(), strict=True):
        for arm in names:
            runs = [r for r in arms.get(arm, {}).values() if r.get("curve")]
            if not runs:
                continue
            steps = [p["step"] for p in runs[0]["curve"]]
            at = [[r["curve"][i]["success_rate"] for r in runs if len(r["curve"]) > i] for i in range(len(steps))]
            line = ax.plot(steps, [statistics.fmean(v) for v in at], marker="o", label=f"{arm} (n={len(runs)})")
            if len(runs) > 1:  # the seeds' band: lowest to highest
                ax.fill_between(steps, [min(v) for v in at], [max(v) for v in at], color=line[0].get_color(), alpha=0.15)
        ax.set_title(title + " (band: seeds' range)")
        ax.set_xlabel("RL step")
        ax.set_ylabel("dev success (greedy)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def over_time(arms, order: list[str]) -> list[str]:
    """SDAR's gate share and SAGE-OPD's turn labels along training: mean over seeds in four step ranges."""
    rows = []
    for arm in order:
        runs = [r.get("over_time") or [] for r in arms.get(arm, {}).values()]
        keys = [k for k in ("gate_above_half", "judge_skip_share", "judge_weak_share", "judge_strong_share")
                if runs and all(any(k in m for m in run) for run in runs)]
        if not keys:
            continue
        last = max(m["step"] for run in runs for m in run)
        edges = [round(last * q / 4) for q in range(5)]
        for key in keys:
            cells = []
            for lo, hi in zip(edges, edges[1:], strict=False):
                seen = [m[key] for run in runs for m in run if lo < m["step"] <= hi and key in m]
                cells.append(f"{100 * statistics.fmean(seen):.1f}%" if seen else "-")
            rows.append(f"| {arm} | {key} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    return ["", "## Over training: SDAR's gate and SAGE-OPD's turn labels (mean over seeds)", "",
            "`gate_above_half`: the share of response tokens whose gate sigmoid(beta (logT - logS)) passes 0.5 "
            "(the self-teacher trusted); `judge_*_share`: SAGE-OPD's Skip / Weak / Strong labels per turn.", "",
            "| arm | measure | 1st quarter of steps | 2nd | 3rd | 4th |", "|---|---|---:|---:|---:|---:|", *rows]


def diagnostic_notes(arms) -> list[str]:
    """What the diagnostics say about what an ablation could show."""
    notes = []
    confidence = [r["diagnostics"]["confidence_mean"] for r in arms.get("sage_opd", {}).values()
                  if "confidence_mean" in r.get("diagnostics", {})]
    if confidence and min(confidence) > 0.99:
        notes.append(f"SAGE-OPD's teacher is certain on these turns (mean c_t {statistics.fmean(confidence):.3f}): "
                     "s_t = i_t * c_t is then i_t, so its ablation s_t = i_t trains the same policy up to rounding; "
                     "the claim about c_t needs a teacher that is unsure somewhere.")
    gates = [r["diagnostics"]["gate_mean"] for r in arms.get("grpo_opsd", {}).values()
             if "gate_mean" in r.get("diagnostics", {})]
    if gates and all(abs(g - 0.5) < 1e-6 for g in gates):
        notes.append("GRPO+OPSD is SDAR with beta 0: its gate is sigmoid(0) = 0.5 on every token (none passes 0.5).")
    return [line for note in notes for line in (note, "")]


def valid_alternatives(results: dict[str, Any], rng: random.Random) -> list[str]:
    """Stage 6: OPD and SAGE-OPD from a student that says an exit several ways."""
    arms, start = by_arm(results.get("phrasings") or []), results.get("phrasings_start")
    if not arms:
        return ["## Not measured here", "",
                "SAGE-OPD's *semantically valid alternative* case: stage 6 (`phrasings`) has not run.", ""]
    budget = results["budget"]
    lines = ["## SAGE-OPD's valid alternatives: a student that says an exit several ways", "",
             f"Stage 6 SFTs the student {budget['phrasing_steps']} steps further on the same practice games with every "
             "exit said one of six ways (`go anchor`, `take the anchor exit`, `enter anchor`, `anchor`, ...), drawn "
             "at random; OPD's teacher says `go <marker>` only. OPD and SAGE-OPD then train from that student with "
             "the frozen lr, budget and seeds. The environment reports each action as it read it "
             "(`info['action_read']`: `take the anchor exit` is `go anchor`), so the `oracle` judge sees the teacher's "
             "action in the student's words: a *valid alternative*. With the oracle such a turn is Skip by "
             "construction (the judge compares what the environment read); what is measured is how often it "
             "arises, what the two methods do to the student's words, and whether skipping it pays.", "",
             "| arm | seeds | test success | turns that took the expert's action, first step -> last | of those, said in "
             "other words | valid alternatives labelled Skip |", "|---|---:|---:|---|---|---:|"]
    if start:
        lines.append(f"| phrasing student (start) | - | {pct(statistics.fmean(start))} | - | - | - |")
    for arm in ("opd", "sage_opd"):
        runs = list(arms.get(arm, {}).values())
        if not runs:
            continue
        seen = [r["wording"] for r in runs if (r.get("wording") or {}).get("first") and r["wording"].get("last")]

        def move(key: str, seen=seen) -> str:
            if not seen:
                return "-"
            return (f"{pct(statistics.fmean(w['first'][key] for w in seen))} -> "
                    f"{pct(statistics.fmean(w['last'][key] for w in seen))}")

        skip = [r["diagnostics"]["judge_alternative_skip_share"] for r in runs
                if "judge_alternative_skip_share" in r.get("diagnostics", {})]
        lines.append(f"| {arm} | {len(runs)} | {pct(statistics.fmean(statistics.fmean(r['test']) for r in runs))} | "
                     f"{move('expert_action')} | {move('in_other_words')} | {pct(statistics.fmean(skip)) if skip else '-'} |")
    lines += ["", "Training episodes, sampled at temperature 1. *Said in other words*: the share of the turns that took "
              "the expert's action (as the environment read it) worded otherwise than the teacher's `go <marker>`. "
              "SAGE-OPD skips such a turn, but its Weak and Strong turns (a wrong exit, an invalid answer) still carry "
              "OPD's loss on every token, the wording's included. *Labelled Skip*: over the steps that had any.", ""]
    sage = [r.get("by_step") or [] for r in arms.get("sage_opd", {}).values()]
    if sage and all(sage):
        def quarter(key: str, q: int) -> float | None:  # None: no step in that quarter (a run of under 4 steps)
            last = max(m["step"] for run in sage for m in run)
            lo, hi = last * q / 4, last * (q + 1) / 4
            seen = [m[key] for run in sage for m in run if lo < m["step"] <= hi and key in m]
            return statistics.fmean(seen) if seen else None

        lines += [f"How often the case arises (SAGE-OPD's judge, mean over seeds): valid alternatives were "
                  f"{pct(quarter('judge_alternative_share', 0))} of turns in the first quarter of training and "
                  f"{pct(quarter('judge_alternative_share', 3))} in the last; the deterministic check (an action the "
                  f"environment did not execute: Strong) took {pct(quarter('judge_check_share', 0))} and "
                  f"{pct(quarter('judge_check_share', 3))}.", ""]
    rows = []
    for name, a, b in (("SAGE-OPD > OPD, from the phrasing student", "sage_opd", "opd"),
                       ("control: OPD > the phrasing student", "opd", "start"),
                       ("control: SAGE-OPD > the phrasing student", "sage_opd", "start")):
        stat = paired_bootstrap(games_of(arms, start, a, "test"), games_of(arms, start, b, "test"), rng)
        if stat is not None:
            rows.append(claim_row(name, stat, ">"))
    if rows:
        lines += ["| claim | A - B | 95% interval | MDE | seeds x games | verdict |", "|---|---:|---|---:|---:|---|",
                  *rows, ""]
    return lines


def write_report(results: dict[str, Any], path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    arms = by_arm(results["main"])
    budget, frozen = results["budget"], results.get("frozen") or {}
    times = results.get("times", {})
    lines = ["# Vaults benchmark: can SDAR's and SAGE-OPD's mechanisms show at nano scale?", "",
             "Generated by `examples/vaults_bench/run.py` from its `results.json`; nothing here is typed by hand.",
             f"Command: `{results['command']}`" + (" (**--quick: tiny budgets, the numbers mean nothing**)"
                                                  if results["quick"] else ""), ""]
    setting = results.get("setting", {})
    lines += ["## Setup", "",
              "`vaults/vaults-v0`: every chamber has 4 marked exits; one marker is right in every vault of a family "
              "(its rule), a wrong exit leads into a dead end. The grid plays a vault's **first decision** "
              f"(`{setting.get('episode')}`): one turn, won when the agent takes the exit its family's rule marks, "
              f"on the families {setting.get('families')}. The family name is in the observation, the rule only in a "
              "skill. The tiny policy (0.5M) is SFT'd on expert games of 240 *practice* "
              f"families whose rules are drawn over all 12 markers ({budget['demos']} games, "
              f"{round(100 * budget['hinted_share'])}% with the family's skill in front, {budget['sft_steps']} steps): "
              "there it must read the skill to act; it has never seen a named family. OPD's teacher: a separate "
              "policy, the student SFT'd further on the 12 named families' expert games without skills "
              f"({budget['teacher_demos']} games, {budget['teacher_steps']} steps). Every arm starts from the same "
              f"student and runs the same steps x {budget['tasks_per_step']} distinct tasks x {budget['group_size']} "
              f"samples, one optimizer update per step, a {budget['warmup_steps']}-step lr warmup, temperature 1: the "
              "budget under which the positive controls (`positive_controls.md`) learn. SDAR's family (GRPO, SDAR, "
              "GRPO+OPSD, OPSD, Skill-GRPO) uses `aggregation: sequence-mean`, as the GRPO control did. OPD and "
              "SAGE-OPD run with the default estimator (`full`, the exact reverse KL: the claims are judged on it) "
              "and with the papers' `sampled` one (`-sampled` arms).", ""]
    premise = results.get("premise")
    if premise:
        lines += ["## Premise (dev games of the RL families, before any RL)", "",
                  "| policy | skill in front | first actions its greedy choice | all expert actions | "
                  "expert log-prob/token |", "|---|---|---:|---:|---:|"]
        for who in ("student", "teacher"):
            for kind in ("none", "right", "wrong"):
                row = premise[f"{who}/{kind}"]
                lines.append(f"| {who} | {kind} | {pct(row.get('first_action_top1'))} | "
                             f"{pct(row['expert_action_top1'])} | {row['expert_logprob']:.3f} |")
        play = premise["play"]
        lines += ["", f"Greedy play on {premise['games']} dev games: student {pct(play['student'])}, student with "
                  f"its family's skill in the prompt {pct(play['student+skill'])}, OPD teacher {pct(play['teacher'])}.", "",
                  "Reading: a first action (the decision that needs the rule) is right by chance a quarter of the "
                  "time (4 exits). "
                  "*student/right* well above *student/none* means the self-teacher reads a rule it never saw in "
                  "SFT (zero-shot on these families); *student/wrong* below chance means it follows the skill even "
                  "when the skill is wrong.", ""]
    pilot = results.get("pilot")
    if pilot:
        lines += ["## Pilot: GRPO on dev fixes the lr and the budget", "",
                  "| lr | dev success by step |", "|---|---|"]
        lines += [f"| {r['lr']:g} | {curve_text(r)} |" for r in pilot["runs"]]
        chosen = pilot["chosen"]
        lines += ["", f"Rule: {pilot['rule']}. Chosen: lr {chosen['lr']:g}, {chosen['steps']} steps x "
                  f"{budget['tasks_per_step']} tasks x {budget['group_size']} samples = "
                  f"{chosen['steps'] * budget['tasks_per_step'] * budget['group_size']} episodes per run.", ""]
    if results.get("sweep"):
        lines += ["## Sweep (dev only, one seed each; frozen before any test game)", "",
                  "| method | setting | dev success by step | chosen |", "|---|---|---|---|"]
        for r in sorted(results["sweep"], key=lambda r: r["method"]):
            setting = ", ".join(f"{k} {v:.3g}" for k, v in r["settings"].items())
            chosen = frozen.get("methods", {}).get(r["method"]) == r["settings"]
            lines.append(f"| {r['method']} | {setting} | {curve_text(r)} | {'yes' if chosen else ''} |")
        lines += ["", f"Frozen at {frozen.get('frozen_at')}: `{ {k: v for k, v in frozen.items() if k != 'frozen_at'} }`.",
                  f"The sweep ran one seed per setting on {budget['curve_games']} dev games: two settings' final "
                  f"rates differ by +-{100 * sweep_noise(results['sweep'], budget['curve_games']):.0f} points (95%) from "
                  "game sampling alone, before seed-to-seed variation, so it guards against a setting that fails "
                  "outright, not more.", ""]
    start = results.get("start_test")
    if arms:
        lines += ["## Test success (greedy, without skills unless said)", "",
                  "| arm | seeds | test success | dev at the end | train s/run |", "|---|---:|---:|---:|---:|"]
        if start:
            lines.append(f"| SFT start | - | {pct(statistics.fmean(start))} | - | - |")
        for arm in results["arms"]:
            runs = list(arms.get(arm, {}).values())
            if not runs:
                continue
            test = statistics.fmean(statistics.fmean(r["test"]) for r in runs)
            dev = statistics.fmean(r["curve"][-1]["success_rate"] for r in runs if r["curve"])
            lines.append(f"| {arm} | {len(runs)} | {pct(test)} | {pct(dev)} | "
                         f"{statistics.fmean(r['train_s'] for r in runs):.0f} |")
            if arm == "skill_grpo":
                with_skills = statistics.fmean(statistics.fmean(r["test_with_skills"]) for r in runs)
                lines.append(f"| skill_grpo, skills in the prompt at test | {len(runs)} | {pct(with_skills)} | - | - |")
        lines += ["", "## Claims: paired differences on test", "",
                  f"Each difference is A - B in points over the same seeds and the same {budget['test_games']} test "
                  f"games, with a 95% interval from {BOOTSTRAP} bootstrap draws over seeds and games; MDE is the "
                  "minimum detectable effect at 80% power (2.8 x the bootstrap standard error). A claim is "
                  "reproduced only when its interval excludes zero in the claimed direction; a `>=` claim when the "
                  f"lower end is above -{round(100 * NON_INFERIORITY)} points.", "",
                  "| claim | A - B | 95% interval | MDE | seeds x games | verdict |", "|---|---:|---|---:|---:|---|"]
        for name, a, b, direction, key_a, key_b in CLAIMS:
            stat = paired_bootstrap(games_of(arms, start, a, key_a), games_of(arms, start, b, key_b), rng)
            if stat is None:
                lines.append(f"| {name} | - | - | - | - | not run |")
                continue
            lines.append(claim_row(name, stat, direction))
        sat = [(arm, [g for g in (late_gain(r) for r in arms.get(arm, {}).values()) if g is not None])
               for arm in ("opd", "sage_opd")]
        if all(gains for _, gains in sat):
            paired = sorted(set(arms["opd"]) & set(arms["sage_opd"]))
            diffs = [late_gain(arms["sage_opd"][s]) - late_gain(arms["opd"][s]) for s in paired
                     if late_gain(arms["sage_opd"][s]) is not None and late_gain(arms["opd"][s]) is not None]
            draws = sorted(statistics.fmean(rng.choice(diffs) for _ in diffs) for _ in range(BOOTSTRAP))
            low, high = draws[int(0.025 * BOOTSTRAP)], draws[int(0.975 * BOOTSTRAP) - 1]
            lines += ["", "OPD saturates early while SAGE-OPD keeps improving? Dev success gained from the middle "
                      "checkpoint to the last: " + ", ".join(f"{arm} {pts(statistics.fmean(g))} points" for arm, g in sat)
                      + f"; SAGE-OPD - OPD {pts(statistics.fmean(diffs))} [{pts(low)}, {pts(high)}] (bootstrap over "
                      f"{len(diffs)} paired seeds): "
                      + ("**reproduced**." if low > 0 else "not reproduced.")]
        diag_rows = []
        for arm in results["arms"]:
            runs = [r["diagnostics"] for r in arms.get(arm, {}).values()]
            keys = [k for k in ("gate_mean", "gate_above_half", "gap_mean", "negative_gap_share", "reverse_kl",
                                "judge_skip_share", "judge_weak_share", "judge_strong_share", "confidence_mean", "Z")
                    if runs and all(k in d for d in runs)]
            if keys:
                diag_rows.append(f"| {arm} | " + ", ".join(f"{k} {statistics.fmean(d[k] for d in runs):.3f}" for k in keys)
                                 + " |")
        lines += over_time(arms, results["arms"])
        lines += ["", "## What the policies did while training (first step -> last step, mean over seeds)", "",
                  "Training episodes (sampled at temperature 1): first action right (the decision the rule "
                  "decides), entered a dead end, went back out of one, won.", "",
                  "| arm | first action right | entered a dead end | went back | won |", "|---|---:|---:|---:|---:|"]
        for arm in results["arms"]:
            seen = [r["behaviour"] for r in arms.get(arm, {}).values()
                    if r.get("behaviour", {}).get("first") and r["behaviour"].get("last")]
            if seen:
                cells = [f"{pct(statistics.fmean(b['first'][k] for b in seen))} -> "
                         f"{pct(statistics.fmean(b['last'][k] for b in seen))}"
                         for k in ("first_right", "dead_end", "went_back", "won")]
                lines.append(f"| {arm} | " + " | ".join(cells) + " |")
        lines += ["", "## Diagnostics (mean over steps and seeds)", "",
                  "Gate: g = sigmoid(beta (logT - logS)) per response token, gap = logT - logS; turn labels: SAGE-OPD's "
                  "Skip / Weak / Strong shares, c_t = the teacher's confidence, Z = the rescaling.", "",
                  "| arm | diagnostics |", "|---|---|", *diag_rows, ""]
        lines += diagnostic_notes(arms)
        image = path.with_name(path.stem + "_curves.png")
        if plot(arms, {"GRPO and self-distillation": ["grpo", "sdar", "sdar-random", "grpo_opsd", "opsd", "skill_grpo"],
                       "distillation from a separate teacher": ["grpo", "opd", "opd-sampled", "sage_opd",
                                                                "sage_opd-sampled", "sage_opd-s=i", "sage_opd-noZ"]},
                image):
            lines += [f"![dev curves]({image.name})", ""]
    runs = {"pilot": (pilot or {}).get("runs", []), "sweep": results.get("sweep") or [], "main": results["main"],
            "phrasings": results.get("phrasings") or []}
    lines += ["## Time", "", "On this machine (2 cores, `--jobs 2`, one thread per run). Wall time of each stage as "
              "the invocation that ran it recorded it (a stage resumed after an interruption records only its "
              "last part): " + ", ".join(f"{k} {v / 60:.1f} min" for k, v in times.items())
              + f"; the whole grid {sum(times.values()) / 60:.1f} min (its budget: 100 min)"
              + ". Process time of the RL runs (training, curves and test games; two run at a time): "
              + ", ".join(f"{k} {len(r)} runs, {sum(x['wall_s'] for x in r) / 60:.0f} process-min"
                          for k, r in runs.items() if r) + ".", ""]
    lines += valid_alternatives(results, rng)
    lines += ["## Secondary: TextWorld and ALFWorld", "",
              "The earlier grid on TextWorld's coin collector and ALFWorld, `examples/nano_repro/run.py`, is "
              "**superseded**: [`nano_repro.md`](nano_repro.md) is kept as it was reported (every comparison there "
              "sat within noise on 3 seeds and 32 games, its privileged block was the game's route rather than a "
              "transferable skill, and it ran before the baselines were aligned with their reference code and before "
              "OPD's exact estimator); do not read its table as today's.", ""]
    path.write_text("\n".join(lines) + "\n")
