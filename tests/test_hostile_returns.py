"""What disks and commands hand a resumed run: a checkpoint folder whose ``COMPLETE`` marker was
deleted from outside, and a ``train --resume`` given settings other than the run's. Each is refused
by name before anything in the run folder changes; following the message's advice then works.

One real run of the tiny model on amber vaults (two steps, a checkpoint after each), copied per test,
through the real CLI in this process.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agentkit.cli import main
from agentkit.core.errors import ConfigError
from agentkit.train.checkpoint import MARKER, checkpoints

RUN = ["--env", "vaults/vaults-v0", "--set", "env.kwargs.families=amber", "--max-turns", "3", "--tasks-per-step", "1",
       "--group-size", "2", "--eval-episodes", "1", "--max-new-tokens", "8", "--checkpoint-every", "1",
       "--checkpoint-keep", "3", "--quiet"]


@pytest.fixture(scope="module")
def finished_run(tiny_model_dir, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("hostile") / "run"
    assert main(["train", *RUN, "--model", str(tiny_model_dir), "--steps", "2", "--out", str(run)]) == 0
    assert checkpoints(run) == [1, 2]
    return run


@pytest.fixture
def run(finished_run, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy)
    return copy


def _disk(run: Path) -> dict[str, tuple]:
    """Every path under the run folder, with each file's bytes and modification time."""
    return {str(p.relative_to(run)): (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else ()
            for p in sorted(run.rglob("*"))}


def _steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _resume(run: Path, *flags: str) -> list[str]:
    return ["train", "--out", str(run), "--resume", "--quiet", *flags]


def test_a_newest_checkpoint_without_its_marker_is_refused_by_name(run, capsys):
    """Resume used to fall back to step-1 silently and later write over step-2; it refuses step-2,
    naming it and the two ways out, and changes nothing. Deleting the folder as told then resumes."""
    from agentkit.train import train
    from agentkit.train.config import load_config

    newest = run / "checkpoints" / "step-2"
    (newest / MARKER).unlink()
    before = _disk(run)
    with pytest.raises(ConfigError, match=rf"{newest} has no {MARKER} marker\..* Restore it, or delete {newest} to "
                                          r"resume from step 1 \(resuming never replaces a newer folder\)"):
        train(load_config(None, [f"out={run}", "train.steps=3"]), resume=True, show_progress=False)
    capsys.readouterr()
    assert main(_resume(run, "--steps", "3")) == 2
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if "has no COMPLETE marker" in line]  # one line says it all
    assert str(newest) in line and f"delete {newest}" in line and "Traceback" not in err
    assert _disk(run) == before, "the refused resume changed the run folder"

    shutil.rmtree(newest)  # the message's advice
    assert main(_resume(run)) == 0
    assert checkpoints(run) == [1, 2] and _steps(run) == [1, 2]  # step 2 played again from step-1


def test_a_checkpoint_file_edited_in_place_is_refused_by_name(run, capsys):
    """state.json's step changed by hand, the size kept: the marker's SHA-256 tells, one line names the file."""
    newest = run / "checkpoints" / "step-2"
    state = (newest / "state.json").read_text()
    edited = state.replace('"step": 2', '"step": 9')
    assert edited != state and len(edited) == len(state)
    (newest / "state.json").write_text(edited)
    before = _disk(run)
    assert main(_resume(run, "--steps", "6")) == 2
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if "is damaged" in line]
    assert "state.json changed since it was written (same size, other bytes" in line and "Traceback" not in err
    assert _disk(run) == before, "the refused resume changed the run folder"
    (newest / "state.json").write_text(state)  # put back as written: it resumes
    assert main(_resume(run, "--steps", "3")) == 0 and checkpoints(run)[-1] == 3


def test_resume_refuses_each_setting_that_changes_the_run(run, tiny_model_dir, tmp_path, capsys):
    """Each setting of what the run computes, given another value (by flag, --set or --config), is
    named with the run's value and the command's; exit 2 and nothing changed. How the run is carried
    out (--env-workers, --checkpoint-every) is named as ignored, and the run's own values pass."""
    before = _disk(run)
    other_model = tmp_path / "other-model"
    other_model.mkdir()
    assert main(_resume(run, "--steps", "3", "--env", "textworld/coin-v0", "--seed", "7", "--group-size", "4",
                        "--set", "env.kwargs.families=kelp", "--objective", "sdar", "--context", "window",
                        "--lr", "0.5", "--model", str(other_model), "--env-workers", "2")) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Nothing was changed" in err
    for named in ("--env (env.id) is 'vaults/vaults-v0' in the run but 'textworld/coin-v0' in this command",
                  "--seed (seed) is 0 in the run but 7 in this command",
                  "--group-size (rollout.group_size) is 2 in the run but 4 in this command",
                  "env.kwargs.families is 'amber' in the run but 'kelp' in this command",
                  "--objective (objective.name) is 'grpo' in the run but 'sdar' in this command",
                  "--context (context.mode) is 'chat' in the run but 'window' in this command",
                  "--lr (train.lr) is 0.0003 in the run but 0.5 in this command",
                  f"in the run but '{other_model}' in this command"):
        assert named in err, err
    assert "env.workers" not in err
    config = tmp_path / "other.yaml"
    config.write_text("seed: 5\nrollout:\n  group_size: 2\n")  # a config file gives settings too
    assert main(_resume(run, "--config", str(config))) == 2
    err = capsys.readouterr().err
    assert "--seed (seed) is 0 in the run but 5 in this command" in err and "group_size" not in err, err
    assert _disk(run) == before, "a refused resume changed the run folder"

    same_model = tiny_model_dir.parent / ".." / tiny_model_dir.parent.name / tiny_model_dir.name  # however written
    assert main(_resume(run, "--steps", "3", "--seed", "0", "--group-size", "2", "--model", str(same_model),
                        "--env-workers", "2", "--checkpoint-every", "2")) == 0
    err = capsys.readouterr().err
    assert "for this invocation: --checkpoint-every (checkpoint.every) = 2, --env-workers (env.workers) = 2" in err, err
    assert _steps(run) == [1, 2, 3]
