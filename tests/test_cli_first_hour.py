"""The first hour with the ``agentkit`` command, as a new user meets it (issue 34): the real CLI in
process (its ``main``), the shipped default model, the built-in vaults environment."""

from __future__ import annotations

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


register("testing/never-built-v0", _NeverBuilt, description="fails if built", overwrite=True)


@pytest.mark.parametrize(("flags", "module", "message"), [
    (["--lora-rank", "8"], "peft", "pip install 'agentkit[lora]'"),
    (["--report-to", "wandb"], "wandb", "pip install 'agentkit[wandb]'"),
    (["--backend", "vllm"], "vllm", "backend=vllm needs vLLM"),
])
def test_a_setting_whose_package_is_missing_is_refused_before_any_work(flags, module, message, monkeypatch, tmp_path,
                                                                        capsys):
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
