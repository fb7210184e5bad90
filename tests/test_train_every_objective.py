"""``agentkit train --objective X --steps 1`` works for every X that ``agentkit objectives list``
shows, on the default environment with the shipped default policy and nothing else given but tiny
episode budgets: objectives that distill from a separate model get the default teacher (built once,
on first use, then reused), ``sft`` the default demonstrations. Slow: it builds the default teacher
of textworld/coin-v0 (its 24 expert games and 40 SFT steps) and plays each objective's step."""

from __future__ import annotations

import time

import pytest
import yaml
from agentkit.objectives import REGISTRY, capabilities_of

from agentkit.cli import main

# the budgets only: one task of two episodes, one evaluation episode at the end
TINY = ["--tasks-per-step", "1", "--group-size", "2", "--eval-episodes", "1", "--no-eval-at-start", "--quiet"]


def listed_objectives() -> list[str]:
    return sorted(spec.name for spec in REGISTRY.specs())


def test_the_list_is_what_the_command_prints(capsys):
    assert main(["objectives", "list"]) == 0
    printed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert sorted(printed) == listed_objectives()


@pytest.mark.slow
@pytest.mark.parametrize("objective", listed_objectives())
def test_train_one_step_of_every_objective_with_default_settings(objective, tmp_path, capsys):
    started = time.perf_counter()
    code = main(["train", "--objective", objective, "--steps", "1", "--out", str(tmp_path / "run"), *TINY])
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    assert "at the end (step 1)" in out and "checkpoint:" in out, out
    assert (tmp_path / "run" / "checkpoints" / "step-1" / "COMPLETE").exists()
    needs = capabilities_of(objective)
    spec = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["teacher"]["spec"]
    if needs.needs_teacher:
        assert f"teacher: {spec if needs.default_teacher else 'the default teacher for textworld/coin-v0'}" in out, out
    print(f"{objective}: {time.perf_counter() - started:.1f} s")
