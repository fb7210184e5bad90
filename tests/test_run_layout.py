"""The run folder's layout lives in agentkit/core/runs.py alone: its names round-trip, and no other
source file spells a run-folder path (a second spelling is how two readers drift apart)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agentkit.core import runs

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agentkit", "rollout", "envs", "objectives", "teachers", "skillbank", "examples", "benchmarks")
SPELLINGS = re.compile(r'f"step-\{|/ "checkpoints"|/ "trajectories"|/ "signals"|/ "metrics\.jsonl"|/ "eval\.jsonl"')


def test_names_round_trip_and_other_names_are_no_step():
    run = Path("RUN")
    assert runs.checkpoint_dir(run, 12) == run / "checkpoints" / "step-12"
    assert runs.trajectory_file(run, 3) == run / "trajectories" / "step-3.jsonl"
    assert runs.generator_file(run, 3) == run / "trajectories" / "step-3.generator.json"
    assert runs.signals_file(run, 7) == run / "signals" / "step-7.jsonl"
    assert (runs.config_file(run), runs.metrics_file(run), runs.eval_file(run)) == (
        run / "config.yaml", run / "metrics.jsonl", run / "eval.jsonl")
    assert runs.step_of(runs.step_name(40)) == 40
    for other in (".step-4-x1y2", "step-", "step-4a", "steps-4", ".trash-step-4-99", "COMPLETE"):
        assert runs.step_of(other) is None, other


def test_a_run_folder_is_told_from_a_model_folder(tmp_path):
    assert not runs.is_run_folder(tmp_path)
    runs.checkpoints_dir(tmp_path).mkdir()
    assert runs.is_run_folder(tmp_path)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_other_file_spells_a_run_folder_path(package):
    spelled = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
               for path in sorted((ROOT / package).rglob("*.py")) if path != ROOT / "agentkit" / "core" / "runs.py"
               for number, line in enumerate(path.read_text().splitlines(), 1) if SPELLINGS.search(line)]
    assert not spelled, "ask agentkit.core.runs instead:\n" + "\n".join(spelled)
