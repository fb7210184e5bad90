"""The first hour with the ``agentkit`` command, as a new user meets it (issue 34): the real CLI in
process (its ``main``), the shipped default model, the built-in vaults environment."""

from __future__ import annotations

import contextlib
import io
import re
import sys
import time

import pytest
from agentkit.envs import REGISTRY, register, status

from agentkit.cli import main

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_envs_list_prints_the_real_extra_and_one_line_per_row_at_100_columns(monkeypatch, capsys):
    monkeypatch.setattr(REGISTRY, "_specs", dict(REGISTRY._specs))
    register("test/needs-missing-v0", "agentkit.envs.vaults_env:VaultsEnv", requires=("agentkit_no_such_module",),
             extra="textworld", description="needs a module that is not installed")
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich lays it out as for a terminal of 100 columns
    assert main(["envs", "list"]) == 0
    lines = ANSI.sub("", capsys.readouterr().out).splitlines()
    assert "pip install 'agentkit[textworld]'" in "\n".join(lines)  # not "pip install 'agentkit'"
    assert lines and all(len(line) <= 100 for line in lines), "\n".join(lines)
    ids = [row.id for row in status()]
    body = [line for line in lines if line.split() and line.split()[0] in ids]
    assert [line.split()[0] for line in body] == ids  # one line each: no row folds onto a second line
    assert len(lines) - len(body) <= 5, "\n".join(lines)  # the title, the header and its rule, blank lines
    missing = next(line for line in body if line.split()[0] == "test/needs-missing-v0")
    assert "missing" in missing and "pip install 'agentkit[textworld]'" in missing, missing


def test_envs_list_in_a_log_keeps_every_row_whole_on_one_line(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("TTY_COMPATIBLE", "0")
    assert main(["envs", "list"]) == 0
    out = capsys.readouterr().out
    for row in status():
        line = next(line for line in out.splitlines() if line.split() and line.split()[0] == row.id)
        assert row.detail in line and "…" not in line, line


class _NeverBuilt:
    """An environment that must not be built: the command should refuse before any env work."""

    def __init__(self, **kwargs):
        raise AssertionError("the environment was built before the settings were checked")


@pytest.fixture
def never_built(monkeypatch):
    """``testing/never-built-v0`` registered for this test only: a module-level registration would
    join every environment test collected after this file in the same process."""
    monkeypatch.setattr(REGISTRY, "_specs", dict(REGISTRY._specs))
    register("testing/never-built-v0", _NeverBuilt, description="fails if built")


@pytest.mark.parametrize(("flags", "module", "message"), [
    (["--lora-rank", "8"], "peft", "pip install 'agentkit[lora]'"),
    (["--report-to", "wandb"], "wandb", "pip install 'agentkit[wandb]'"),
    (["--backend", "vllm"], "vllm", "backend=vllm needs vLLM"),
])
def test_a_setting_whose_package_is_missing_is_refused_before_any_work(flags, module, message, monkeypatch, tmp_path,
                                                                        capsys, never_built):
    monkeypatch.setitem(sys.modules, module, None)  # the fault: not installed (import fails, find_spec is None)
    started = time.perf_counter()
    code = main(["train", "--env", "testing/never-built-v0", "--steps", "1", "--out", str(tmp_path / "run"), "--quiet",
                 *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert time.perf_counter() - started < 5 and not (tmp_path / "run").exists()


SMALL = ["--tasks-per-step", "1", "--group-size", "2", "--eval-episodes", "1", "--max-new-tokens", "8",
         "--no-eval-at-start", "--quiet"]


def test_dashes_and_underscores_alike_in_objective_and_environment_names(tmp_path, capsys):
    import yaml

    run = tmp_path / "run"
    assert main(["train", "--objective", "grpo-opsd", "--env", "vaults/vaults_v0", "--steps", "1", "--out", str(run),
                 *SMALL]) == 0, capsys.readouterr().err
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["objective"]["name"] == "grpo_opsd" and saved["env"]["id"] == "vaults/vaults-v0"  # as registered
    assert main(["train", "--help-config", "--objective", "sage-opd"]) == 0
    assert "objective.args for 'sage-opd'" in capsys.readouterr().out
    assert main(["train", "--objective", "sage-opdd", "--steps", "1", "--out", str(tmp_path / "x")]) == 2
    assert "Did you mean 'sage_opd'" in capsys.readouterr().err  # a real typo still gets the suggestion


def test_progress_in_a_log_is_a_line_per_tenth_never_a_carriage_return(tmp_path, capsys):
    """stderr is not a terminal here (captured), as in a log file or a pipe."""
    assert main(["train", "--env", "vaults/vaults-v0", "--steps", "2", "--out", str(tmp_path / "run"),
                 *[flag for flag in SMALL if flag != "--quiet"]]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err, repr(err)
    assert "train grpo: 1/2 step (50%)" in err and "train grpo: 2/2 step (100%)" in err, err
    assert main(["rollout", "--env", "vaults/vaults-v0", "--episodes", "20", "--max-turns", "2", "--max-new-tokens", "8",
                 "--out", str(tmp_path / "r.jsonl")]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("rollout vaults/vaults-v0: ")]
    assert "\r" not in err and len(lines) == 10 and lines[-1].startswith("rollout vaults/vaults-v0: 20/20 ep (100%)"), err


def test_line_progress_shows_each_mark_once_with_the_figures_of_its_item(capsys):
    from agentkit.core.progress import LineProgress

    bar = LineProgress(total=25, desc="work", unit="ep")
    for done in range(1, 21):  # stopped at 20 of 25
        bar.update(1)
        bar.set_postfix(done=done)
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    marks = [line.split(":")[1].split(",")[0].strip() for line in lines]
    assert marks == ["3/25 ep (12%)", "5/25 ep (20%)", "8/25 ep (32%)", "10/25 ep (40%)", "13/25 ep (52%)",
                     "15/25 ep (60%)", "18/25 ep (72%)", "20/25 ep (80%)"], lines
    assert all(line.endswith(f"done={mark.split('/')[0]}") for line, mark in zip(lines, marks, strict=True)), lines


def test_eval_of_a_run_folder_says_which_checkpoint_first_and_once(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--env", "vaults/vaults-v0", "--steps", "1", "--out", str(run), *SMALL]) == 0
    capsys.readouterr()
    both = io.StringIO()  # stdout and stderr in the order written, as a terminal shows them
    with contextlib.redirect_stdout(both), contextlib.redirect_stderr(both):
        assert main(["eval", "--model", str(run), "--episodes", "2", "--quiet"]) == 0
    shown = both.getvalue()
    note = f"--model {run} is a run folder: using its newest checkpoint, {run}/checkpoints/step-1"
    assert shown.count(note) == 1, shown
    assert shown.index(note) < shown.index("success"), shown


def test_train_without_out_makes_a_new_timestamped_folder_each_time(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    folders = []
    for _ in range(2):  # the same second too: the second run gets a folder of its own
        assert main(["train", "--env", "vaults/vaults-v0", "--steps", "1", *SMALL]) == 0
        out, err = capsys.readouterr()
        named = re.search(r"run folder: (runs/train-\d{8}-\d{6}(-\d+)?) \(--out to choose one\)", err)
        assert named, err
        assert f"run folder: {named.group(1)} (metrics.jsonl" in out, out  # and in the final lines
        folders.append(named.group(1))
    assert folders[0] != folders[1] and all((tmp_path / f / "checkpoints" / "step-1").is_dir() for f in folders)
    assert main(["train", "--env", "vaults/vaults-v0", "--resume"]) == 2
    assert "--resume continues a run: pass its folder, --out RUN_DIR" in capsys.readouterr().err


def test_the_readme_quick_start_installs_into_a_new_virtual_environment():
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in quick.strip().splitlines()]
    assert commands[0].startswith("python3 -m venv .venv") and "source .venv/bin/activate" in commands[0], commands
    assert next(i for i, c in enumerate(commands) if c.startswith("pip install")) > 0, commands
    assert "agentkit train --objective sage_opd --steps 1" in commands, commands
