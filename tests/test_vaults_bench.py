"""examples/vaults_bench: the report's statistics (fast), and --quick running every stage (slow)."""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parents[1] / "examples" / "vaults_bench"


def _import(name: str):
    """The example's ``name``.py under a name of its own: examples/nano_repro has a run.py and a report.py too."""
    spec = importlib.util.spec_from_file_location(f"vaults_bench_{name}", FOLDER / f"{name}.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


def test_paired_bootstrap_finds_a_real_difference_and_its_interval_covers_it():
    report = _import("report")
    rng = random.Random(3)
    # 5 seeds x 256 games: A wins 60%, B 40% of games, drawn independently per seed and game
    a = {s: [int(rng.random() < 0.6) for _ in range(256)] for s in range(5)}
    b = {s: [int(rng.random() < 0.4) for _ in range(256)] for s in range(5)}
    stat = report.paired_bootstrap(a, b, random.Random(0))
    point = sum(map(sum, a.values())) / 1280 - sum(map(sum, b.values())) / 1280
    assert stat["diff"] == pytest.approx(point)
    assert stat["low"] < point < stat["high"] and stat["low"] > 0.1 and stat["high"] < 0.3
    assert 0.03 < stat["mde"] < 0.12 and (stat["seeds"], stat["games"]) == (5, 256)
    assert report.verdict(stat, ">") == "**reproduced**" and report.verdict(stat, "<") == "not reproduced"
    # the same arm against itself: difference 0, no claim in either direction, non-inferior
    same = report.paired_bootstrap(a, a, random.Random(0))
    assert same["diff"] == 0 and same["low"] == 0 == same["high"]
    assert report.verdict(same, ">") == "not reproduced" and report.verdict(same, ">=").startswith("**reproduced**")
    # only paired seeds count
    assert report.paired_bootstrap(a, {7: b[0]}, random.Random(0)) is None


def test_late_gain_reads_the_curve_from_its_middle_to_its_end():
    report = _import("report")
    curve = [{"step": s, "success_rate": r} for s, r in ((0, 0.1), (5, 0.3), (10, 0.35), (15, 0.5), (20, 0.45))]
    assert report.late_gain({"curve": curve}) == pytest.approx(0.45 - 0.35)
    assert report.late_gain({"curve": curve[:2]}) is None


@pytest.mark.slow
def test_quick_grid_runs_every_stage_and_freezes_before_test(tmp_path):
    run = _import("run")
    out, report = tmp_path / "grid", tmp_path / "report" / "vaults_bench.md"
    done = subprocess.run([sys.executable, str(FOLDER / "run.py"), "--out", str(out), "--report", str(report), "--quick",
                           "--seeds", "0", "--jobs", "0"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert sorted(r["arm"] for r in results["main"]) == sorted(run.ARMS)
    assert {"student/none", "student/right", "student/wrong", "teacher/none", "play"} <= set(
        results["premise"])
    assert len(results["pilot"]["runs"]) == len(run.PILOT_LRS)
    assert len(results["sweep"]) == sum(len(v) for v in run.SWEEP.values())
    assert set(results["frozen"]["methods"]) == {"grpo", *run.SWEEP}
    frozen_at = (out / "frozen.json").stat().st_mtime
    for r in results["main"]:  # test games are played only after the settings were frozen
        assert len(r["test"]) == run.QUICK.test_games and set(r["test"]) <= {0, 1}
        assert (out / "main" / f"{r['arm']}:seed-0" / "result.json").stat().st_mtime > frozen_at
        assert r["settings"] == results["frozen"]["methods"][run.METHOD_OF[r["arm"]]]
    assert "test_with_skills" in next(r for r in results["main"] if r["arm"] == "skill_grpo")
    # the same budget, lr and KL for every arm; paired seeds
    assert {(r["steps"], r["lr"], r["seed"]) for r in results["main"]} == {(results["frozen"]["steps"],
                                                                            results["frozen"]["lr"], 0)}
    # stage 6: OPD and SAGE-OPD again from the phrasing student, tested after the freeze too
    assert sorted(r["arm"] for r in results["phrasings"]) == sorted(run.PHRASED_ARMS)
    for r in results["phrasings"]:
        assert len(r["test"]) == run.QUICK.test_games and r["settings"] == results["frozen"]["methods"]["grpo"]
        assert (out / "phrasings" / f"{r['arm']}:seed-0" / "result.json").stat().st_mtime > frozen_at
        assert r["wording"]["first"] is not None and len(r["by_step"]) == results["frozen"]["steps"]
    assert "judge_alternative_share" in next(r for r in results["phrasings"] if r["arm"] == "sage_opd")["diagnostics"]
    assert len(results["phrasings_start"]) == run.QUICK.test_games
    text = report.read_text()
    for heading in ("## Premise", "## Pilot", "## Sweep", "## Claims: paired differences on test", "SDAR > GRPO",
                    "SAGE-OPD > OPD", "## Diagnostics", "## SAGE-OPD's valid alternatives",
                    "SAGE-OPD > OPD, from the phrasing student", "## Time", "the whole grid"):
        assert heading in text, heading
    assert (report.parent / "vaults_bench_curves.png").stat().st_size > 0


def test_behaviour_reads_first_actions_dead_ends_and_recoveries_from_the_training_episodes(tmp_path):
    run = _import("run")
    folder = tmp_path / "trajectories"
    folder.mkdir()

    def turn(action, expert, feedback=""):
        return {"action": action, "expert_action": expert, "feedback": feedback}

    episodes = [  # right first; wrong into a dead end and back; an unparseable first answer; wrong, never back
        {"won": True, "turns": [turn("go star", "go star")]},
        {"won": True, "turns": [turn("go moon", "go star", "You take the moon exit into a dead end."),
                                turn("go back", "go back")]},
        {"won": False, "turns": [turn(None, "go sun")]},
        {"won": False, "turns": [turn("take the moon exit", "go sun", "You take the moon exit into a dead end.")]},
    ]
    (folder / "step-3.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    assert run.behaviour(tmp_path, 3) == {"first_right": 0.25, "dead_end": 0.5, "went_back": 0.25, "won": 0.5}
    assert run.behaviour(tmp_path, 4) is None


def test_wording_counts_the_experts_action_said_in_other_words(tmp_path):
    run = _import("run")
    folder = tmp_path / "trajectories"
    folder.mkdir()

    def turn(action, read, expert, valid=True):
        return {"action": action, "action_read": read, "expert_action": expert, "action_valid": valid}

    episodes = [{"turns": [turn("take the star exit", "go star", "go star")]},
                {"turns": [turn("go star", "go star", "go star")]},
                {"turns": [turn("enter moon", "go moon", "go star"), turn("back", "go back", "go back")]},
                {"turns": [turn("dance", None, "go sun", valid=False)]}]
    (folder / "step-2.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    assert run.wording(tmp_path, 2) == {"expert_action": 3 / 5, "in_other_words": 2 / 3}
    assert run.wording(tmp_path, 5) is None


def test_reword_says_each_exit_another_way_that_the_env_reads_as_the_same(tiny_model_dir):
    from agentkit.envs import make
    from agentkit.envs.vaults_env import PHRASINGS
    from agentkit.rollout.hf_backend import load_tokenizer

    run = _import("run")
    tokenizer = load_tokenizer(tiny_model_dir)
    games = run.expert_games(tokenizer, families="practice", split="train", seeds=range(12), budget=run.QUICK)
    rng = random.Random(0)
    worded = [run.reword(g, rng, tokenizer) for g in games]
    env = make("vaults/vaults-v0", families="practice", action_parser="format")
    used = set()
    for game, new in zip(games, worded, strict=True):
        env.reset(seed=game.seed)
        for old, turn in zip(game.turns, new.turns, strict=True):
            assert turn.response_ids == tokenizer.encode(turn.response_text, add_special_tokens=False)
            assert turn.context_ids == old.context_ids
            _, _, _, _, info = env.step(turn.response_text)
            assert info["action"] == turn.action and info["action_read"] == old.action and info["action_valid"]
            used.add(turn.action.replace(old.action.split()[1], "{m}"))
    assert used <= set(PHRASINGS) and len(used) >= 4  # several phrasings drawn, not one


def test_diagnostics_average_the_skip_share_of_valid_alternatives_only_over_steps_that_had_some():
    run = _import("run")
    metrics = [{"step": 1, "judge_alternative_share": 0.1, "judge_alternative_skip_share": 1.0, "Z": 2.0},
               {"step": 2, "judge_alternative_share": 0.0, "judge_alternative_skip_share": 0.0, "Z": 4.0},  # none
               {"step": 3, "judge_alternative_share": 0.2, "judge_alternative_skip_share": 0.5, "Z": 3.0}]
    assert run.diagnostics(metrics) == {"judge_alternative_share": pytest.approx(0.1),
                                        "judge_alternative_skip_share": 0.75, "Z": 3.0}
