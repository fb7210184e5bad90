"""Every example runs, with tiny budgets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.mark.textworld
def test_collect_trajectories_example(tiny_model_dir, tmp_path):
    pytest.importorskip("textworld")
    out = tmp_path / "coin.jsonl"
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "collect_trajectories.py"), "--episodes", "2", "--group-size", "1",
         "--max-turns", "2", "--model", str(tiny_model_dir), "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "2 episodes" in result.stdout and out.exists()


def test_every_example_has_a_test():
    tested = {"collect_trajectories.py", "recipe_textworld.py"}  # the recipe: tests/test_recipe.py
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested
