"""agentkit.core.evalstats on hand-computed values."""

from __future__ import annotations

import math

import pytest

from agentkit.core.evalstats import paired_difference, pass_at_k, wilson


def test_wilson_matches_the_closed_form():
    # 7 of 16: p = 0.4375, z = 1.96 -> centre 0.449600, half 0.218614
    low, high = wilson(7, 16)
    assert low == pytest.approx(0.230987, abs=1e-5) and high == pytest.approx(0.668214, abs=1e-5)
    assert wilson(0, 10)[0] == 0.0 and 0.2 < wilson(0, 10)[1] < 0.35  # not empty at 0 successes
    assert wilson(10, 10)[1] == 1.0 and wilson(10, 10)[0] > 0.65
    assert wilson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson(11, 10)


def test_pass_at_k_is_the_unbiased_estimator():
    # n = 5 samples, c = 2 correct: pass@1 = 2/5; pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 2, 4) == 1.0  # 4 draws from 3 wrong ones must hold a correct one
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(10, 3, 3) == pytest.approx(1 - math.comb(7, 3) / math.comb(10, 3))
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_paired_difference_interval():
    a, b = [1, 1, 0, 1, 0, 1], [0, 1, 0, 0, 0, 1]  # differences 1, 0, 0, 1, 0, 0: mean 1/3, sd 0.5164
    mean, low, high = paired_difference(a, b)
    half = 1.959963984540054 * 0.5163978 / math.sqrt(6)
    assert mean == pytest.approx(1 / 3) and low == pytest.approx(1 / 3 - half, abs=1e-6)
    assert high == pytest.approx(1 / 3 + half, abs=1e-6)
    with pytest.raises(ValueError, match="pair them"):
        paired_difference([1, 0], [1])


def _episode(seed: int, won: bool, turns: int, task_type: str | None = None):
    from agentkit.core.trajectory import Trajectory, Turn

    turn = Turn(observation="o", context_ids=[1], response_ids=[2], response_logprobs=[-0.1], response_text="r",
                action="a", action_valid=True, reward=0.0, feedback="")
    return Trajectory(id=f"{seed}-{won}-{turns}", env="e", task=str(seed), seed=seed, split="eval", group=str(seed),
                      sample=0, turns=[turn] * turns, episode_return=float(won), won=won, score=float(won),
                      terminated=won, truncated=not won, model="m", sampling={}, task_type=task_type)


def test_eval_report_counts_tasks_samples_and_types():
    from agentkit.rollout.report import compare_report, eval_report

    # task 0: 2 of 3 won (turns 2, 4); task 1: 0 of 3; task 2: 3 of 3 (turns 1 each); two types
    episodes = [_episode(0, True, 2, "pick"), _episode(0, False, 5, "pick"), _episode(0, True, 4, "pick"),
                *[_episode(1, False, 5, "clean") for _ in range(3)], *[_episode(2, True, 1, "pick") for _ in range(3)]]
    report = eval_report(episodes)
    assert report["tasks"] == 3 and report["episodes"] == 9 and report["success_rate"] == pytest.approx(5 / 9)
    assert report["success_ci95"] == pytest.approx(list(wilson(5, 9)))
    assert report["mean_turns_solved"] == pytest.approx((2 + 4 + 1 + 1 + 1) / 5)
    assert report["samples_per_task"] == 3
    # pass@1 = mean(2/3, 0, 1); pass@2 = mean(1 - C(1,2)/C(3,2) = 1, 0, 1); pass@3 = mean(1, 0, 1)
    assert report["pass_at_k"] == pytest.approx({"1": (2 / 3 + 0 + 1) / 3, "2": 2 / 3, "3": 2 / 3})
    assert report["by_task_type"]["clean"]["success_rate"] == 0.0
    assert report["by_task_type"]["pick"]["tasks"] == 2
    other = [_episode(0, False, 5), _episode(1, True, 3), _episode(2, True, 2), _episode(3, True, 1)]
    compared = compare_report(episodes, other)  # tasks 0..2 only; A - B per task: 2/3 - 0, 0 - 1, 1 - 1
    assert compared["tasks"] == 3 and compared["difference"] == pytest.approx((2 / 3 - 1 + 0) / 3)
    assert compared["difference_ci95"][0] < compared["difference"] < compared["difference_ci95"][1]


def test_eval_samples_report_pass_at_k_and_write_json(vaults_sft_model, tmp_path):
    import json
    import subprocess
    import sys

    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "agentkit.cli", "eval", "--model", str(vaults_sft_model), "--env",
                           "vaults/vaults-v0", "--env-kwargs", "families=amber", "--max-turns", "4", "--episodes", "3",
                           "--samples", "4", "--report", str(report), "--out", str(tmp_path / "eval.jsonl")],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    written = json.loads(report.read_text())
    assert written["tasks"] == 3 and written["episodes"] == 12 and written["samples_per_task"] == 4
    assert set(written["pass_at_k"]) == {"1", "2", "4"}
    assert written["pass_at_k"]["1"] <= written["pass_at_k"]["2"] <= written["pass_at_k"]["4"]
    assert written["success_ci95"][0] <= written["success_rate"] <= written["success_ci95"][1]
    assert "pass@4" in done.stdout and "95% CI" in done.stdout
    lines = (tmp_path / "eval.jsonl").read_text().splitlines()
    assert len(lines) == 12 and {json.loads(line)["sample"] for line in lines} == {0, 1, 2, 3}


@pytest.mark.slow  # 25-45 s here
def test_eval_compare_plays_both_models_on_the_same_tasks(sft_model, tiny_model_dir, tmp_path):
    """``eval --compare A B``: A's episodes are the ones ``eval --model A`` plays on the same seeds, and
    the paired difference over one greedy episode per task is A's success rate minus B's."""
    import json
    import subprocess
    import sys

    common = ["--env", "textworld/coin-v0", "--env-kwargs", "level=1", "--max-turns", "3", "--episodes", "4",
              "--seed", "2"]

    def eval_(*flags: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "agentkit.cli", "eval", *common, *flags, "--quiet"],
                              capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        return done

    done = eval_("--compare", str(sft_model), str(tiny_model_dir), "--report", "compare.json")
    eval_("--model", str(sft_model), "--report", "a.json")
    compared, alone = json.loads((tmp_path / "compare.json").read_text()), json.loads((tmp_path / "a.json").read_text())
    assert compared["tasks"] == 4 and compared["a"]["episodes"] == compared["b"]["episodes"] == 4
    assert compared["a"]["success_rate"] == alone["success_rate"] > compared["b"]["success_rate"]
    assert compared["difference"] == pytest.approx(compared["a"]["success_rate"] - compared["b"]["success_rate"])
    low, high = compared["difference_ci95"]
    assert low <= compared["difference"] <= high
    assert compared["model_a"] == str(sft_model) and "paired difference A - B over 4 tasks" in done.stdout


def test_eval_compare_refuses_what_cannot_be_paired(tmp_path):
    import subprocess
    import sys

    for flags, said in ((["--compare", "a"], "compare takes two models"),
                        (["--compare", "a", "b", "--model", "c"], "not both"),
                        (["--compare", "a", "b", "--out", "x.jsonl"], "--report FILE")):
        done = subprocess.run([sys.executable, "-m", "agentkit.cli", "eval", "--env", "vaults/vaults-v0", *flags],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert done.returncode != 0 and said in done.stderr and "Traceback" not in done.stderr, done.stderr
