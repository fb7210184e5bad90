"""``agentkit train`` as a new user meets it: failures say what happened, resume keeps the run's
settings, a folder that never finished a step does not block a new run. Real CLI, in process
(so a test can register a broken environment), on the built-in vaults environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agentkit.envs import register

from agentkit.cli import main
from agentkit.train.checkpoint import checkpoints

SMALL = ["--env", "vaults/vaults-v0", "--tasks-per-step", "1", "--group-size", "2", "--eval-episodes", "1",
         "--max-new-tokens", "8", "--quiet"]


class _ResetFails:
    """Builds fine, fails every reset, as an environment given settings it cannot play does."""

    def reset(self, *, seed=None, options=None):
        raise RuntimeError("no task file for level 2 in this environment")

    def step(self, action):  # pragma: no cover - never reached
        raise AssertionError

    def close(self):
        pass


register("testing/reset-fails-v0", _ResetFails, description="every reset raises", overwrite=True)


def _steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_every_episode_failing_stops_with_the_episodes_error(tmp_path, capsys):
    code = main(["train", "--env", "testing/reset-fails-v0", "--steps", "2", "--out", str(tmp_path / "run"),
                 "--quiet", "--max-turns", "3"])
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback" not in err
    assert "no task file for level 2" in err, err
    assert "no tokens to train on" not in err


def test_every_episode_failing_below_the_error_limit_still_names_the_error(tmp_path, capsys):
    code = main(["train", "--env", "testing/reset-fails-v0", "--steps", "2", "--out", str(tmp_path / "run"),
                 "--quiet", "--max-turns", "3", "--max-env-errors", "0"])
    err = capsys.readouterr().err
    assert code == 2
    assert "every episode of step 1 failed" in err and "no task file for level 2" in err, err


def test_a_folder_that_never_finished_a_step_is_started_anew(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--env", "testing/reset-fails-v0", "--steps", "1", "--out", str(run), "--quiet",
                 "--max-turns", "3"]) == 2
    assert (run / "config.yaml").exists()  # the failed start left its folder
    capsys.readouterr()
    assert main(["train", *SMALL, "--steps", "1", "--out", str(run)]) == 0
    captured = capsys.readouterr()
    assert "stopped before its first step; starting anew" in captured.err
    assert _steps(run) == [1]
    assert "at the end (step 1)" in captured.out and "checkpoint:" in captured.out


def test_resume_keeps_the_run_length_and_applies_the_runtime_settings_given(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *SMALL, "--steps", "1", "--out", str(run)]) == 0
    capsys.readouterr()
    # another --lr would change the run: refused, naming it; --env-workers only changes how it runs: applied
    assert main(["train", "--out", str(run), "--resume", "--lr", "0.5", "--quiet"]) == 2
    assert "--lr (train.lr) is 0.0003 in the run but 0.5 in this command" in capsys.readouterr().err
    # no --steps: the saved run length (1), not the default 20
    assert main(["train", "--out", str(run), "--resume", "--env-workers", "1", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "for this invocation: --env-workers (env.workers) = 1" in err
    assert _steps(run) == [1]
    # a runtime setting given on resume is applied: checkpoints every 2 steps (and the last) from here
    assert main(["train", "--out", str(run), "--resume", "--steps", "4", "--checkpoint-every", "2", "--quiet"]) == 0
    assert "--checkpoint-every (checkpoint.every) = 2" in capsys.readouterr().err
    assert _steps(run) == [1, 2, 3, 4] and checkpoints(run) == [2, 4]  # the saved every 5 would keep 1 and 4
    saved = (run / "config.yaml").read_text()
    assert "lr: 0.0003" in saved and "steps: 4" in saved  # the new length is the run's now; lr stays its own
    assert "every: 2" not in saved  # a runtime setting holds for its invocation only
    capsys.readouterr()
    files = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(run.rglob("*")) if p.is_file()}
    # a finished run: nothing to do, and nothing changes, not even the saved length when --steps is shorter
    for shorter in ([], ["--steps", "1"]):
        assert main(["train", "--out", str(run), "--resume", "--quiet", *shorter]) == 0
        assert "already has 4 steps (checkpoint step-4); nothing to do, nothing changed" in capsys.readouterr().err
        assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(run.rglob("*")) if p.is_file()} == files


def test_bad_env_settings_fail_before_the_run_folder_is_written(tmp_path, capsys):
    run = tmp_path / "run"
    code = main(["train", "--env", "vaults/vaults-v0", "--env-kwargs", "no_such_setting=1", "--out", str(run), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "no_such_setting" in err and "Traceback" not in err
    assert not run.exists()


@pytest.mark.parametrize("command", ["eval", "rollout"])
def test_a_run_folder_as_model_plays_with_the_runs_settings(tmp_path, capsys, command):
    run = tmp_path / "run"
    assert main(["train", *SMALL, "--steps", "1", "--out", str(run), "--context", "window", "--window", "1"]) == 0
    capsys.readouterr()
    out = tmp_path / "t.jsonl"
    assert main([command, "--model", str(run), "--episodes", "1", "--out", str(out), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "playing with the settings of the run" in captured.err
    record = json.loads(out.read_text().splitlines()[0])
    assert record["env"] == "vaults/vaults-v0" and record["context_mode"] == "window"
    assert "checkpoints/step-1" in captured.err  # the run's newest checkpoint is the policy
    # what the command does is the library's: Python users get the same settings
    from agentkit.rollout.config import RolloutConfig
    from agentkit.rollout.run import trained_settings

    from agentkit.core.config import settings_of

    keys = {row.key for row in settings_of(RolloutConfig)}
    for model in (run, run / "checkpoints" / "step-1"):
        played = trained_settings(model, keys, {})
        assert played["env.id"] == "vaults/vaults-v0" and played["context.mode"] == "window"
        assert played["context.window"] == 1
    assert "env.id" not in trained_settings(run, keys, {"env.id": "textworld/coin-v0"})  # another game: its own
    assert trained_settings(tmp_path, keys, {}) == {}  # not a run
