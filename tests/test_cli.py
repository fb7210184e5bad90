"""`agentkit` end to end, as a user runs it: real subprocesses, real model, real games."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentkit.core.jsonl import read_trajectories


def run_cli(*args: str, cwd: Path | None = None, extra_path: Path | None = None, timeout: int = 300):
    env = dict(os.environ)
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(extra_path), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "agentkit.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)


def test_help_imports_nothing_heavy():
    """--help answers in well under a second because it imports no torch, transformers or
    environment package (a structural check; timings belong in benchmarks)."""
    result = run_cli("--help")
    assert result.returncode == 0 and "rollout" in result.stdout
    for args in (["--help"], ["rollout", "--help"], ["envs", "--help"]):
        out = subprocess.run([sys.executable, "-X", "importtime", "-m", "agentkit.cli", *args], capture_output=True, text=True)
        imported = {line.split("|")[-1].strip().split(".")[0] for line in out.stderr.splitlines() if "|" in line}
        # numpy does come, under gymnasium: importing agentkit.envs registers its ids with Gymnasium
        assert not imported & {"torch", "transformers", "textworld", "tokenizers"}, args


@pytest.mark.textworld
@pytest.mark.slow  # 14-30 s here: keeps the default run under 15 minutes
def test_rollout_textworld_writes_valid_trajectories(tiny_model_dir, tmp_path):
    pytest.importorskip("textworld")
    out = tmp_path / "tw.jsonl"
    result = run_cli("rollout", "--env", "textworld/simple-v0", "--model", str(tiny_model_dir), "--episodes", "2",
                     "--group-size", "2", "--max-turns", "3", "--out", str(out), "--seed", "5")
    assert result.returncode == 0, result.stderr
    assert "success rate" in result.stdout and "tokens/s" in result.stdout
    trajectories = read_trajectories(out, strict=True)
    assert len(trajectories) == 4
    assert sorted({t.seed for t in trajectories}) == [5, 6]
    assert all(len(t.turns) == 3 and t.env == "textworld/simple-v0" for t in trajectories)


@pytest.mark.slow  # 14-30 s here: keeps the default run under 15 minutes
def test_rollout_on_plugin_environment(tiny_model_dir, plugin_site, tmp_path):
    listed = run_cli("envs", "list", extra_path=plugin_site)
    assert "demo/lock-v0" in listed.stdout and "agentkit-plugin-demo" in listed.stdout
    checked = run_cli("envs", "check", "demo/lock-v0", extra_path=plugin_site)
    assert checked.returncode == 0, checked.stderr
    assert "expert won 3/3 tasks" in checked.stdout
    out = tmp_path / "lock.jsonl"
    result = run_cli("rollout", "--env", "demo/lock-v0", "--model", str(tiny_model_dir), "--episodes", "3",
                     "--max-turns", "2", "--out", str(out), "--context", "window", extra_path=plugin_site)
    assert result.returncode == 0, result.stderr
    trajectories = read_trajectories(out, strict=True)
    assert len(trajectories) == 3 and all(t.env == "demo/lock-v0" for t in trajectories)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "textworld/simpel-v0"], "Did you mean 'textworld/simple-v0'"),
        (["--episodes", "0"], r"--episodes .*greater than 0"),
        (["--group-size", "-1"], r"--group-size .*greater than 0"),
        (["--model", "/nonexistent/model"], "--model /nonexistent/model: no such folder"),
        (["--append", "--overwrite"], "exclude each other"),
        (["--out", "{tmp}/afile/t.jsonl"], "Cannot write"),
        (["--env-kwargs", "level"], "key=value"),
    ],
)
def test_bad_input_is_a_clear_error(tiny_model_dir, tmp_path, args, message):
    (tmp_path / "afile").write_text("a file, not a folder")
    base = ["rollout", "--model", str(tiny_model_dir), "--out", str(tmp_path / "o.jsonl")]
    result = run_cli(*base, *[a.format(tmp=tmp_path) for a in args])
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    import re

    assert re.search(message, result.stderr), result.stderr


@pytest.mark.slow  # 14-30 s here: keeps the default run under 15 minutes
def test_existing_output_is_refused_then_appended(tiny_model_dir, plugin_site, tmp_path):
    out = tmp_path / "t.jsonl"
    out.write_text("precious\n")
    common = ["rollout", "--env", "demo/lock-v0", "--model", str(tiny_model_dir), "--episodes", "1", "--max-turns", "1",
              "--out", str(out)]
    refused = run_cli(*common, extra_path=plugin_site)
    assert refused.returncode == 2 and "--append" in refused.stderr
    assert out.read_text() == "precious\n"

    out.unlink()
    assert run_cli(*common, extra_path=plugin_site).returncode == 0
    assert run_cli(*common, "--append", "--seed", "1", extra_path=plugin_site).returncode == 0
    assert [t.seed for t in read_trajectories(out, strict=True)] == [0, 1]
    assert run_cli(*common, "--overwrite", "--seed", "2", extra_path=plugin_site).returncode == 0
    assert [t.seed for t in read_trajectories(out, strict=True)] == [2]


@pytest.mark.textworld
@pytest.mark.slow  # 14-30 s here: keeps the default run under 15 minutes
def test_rollout_with_no_flags_just_works(tmp_path, agentkit_cache):
    """The README's main command: defaults everywhere, with the shipped default model (the recipe's policy)."""
    pytest.importorskip("textworld")
    result = run_cli("rollout", "--quiet", cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr
    files = list((tmp_path / "runs").glob("rollout-*.jsonl"))
    assert len(files) == 1 and len(read_trajectories(files[0], strict=True)) == 8
    from agentkit.models import MODEL_INFO_FILE, ensure_default_model

    info = json.loads((ensure_default_model() / MODEL_INFO_FILE).read_text())
    assert info["builder"] == "examples/recipe_textworld.py" and info["stage"] == "grpo"
    assert read_trajectories(files[0])[0].model == str(ensure_default_model())


def test_model_init_refuses_non_empty_folder(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "keep.txt").write_text("x")
    result = run_cli("model", "init", "--out", str(tmp_path / "m"))
    assert result.returncode == 2 and "not empty" in result.stderr
    assert (tmp_path / "m" / "keep.txt").read_text() == "x"
