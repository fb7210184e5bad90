"""examples/positive_controls: one command runs every control from a prepared student and writes the
report (here on the quick budgets: it checks the wiring; the learning is tests/test_learning.py's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parent.parent / "examples" / "positive_controls"


@pytest.mark.slow
def test_quick_controls_run_every_control_and_write_the_report(tmp_path):
    out, report = tmp_path / "controls", tmp_path / "report" / "positive_controls.md"
    done = subprocess.run([sys.executable, str(FOLDER / "run.py"), "--out", str(out), "--report", str(report), "--quick",
                           "--jobs", "0"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sys.path.insert(0, str(FOLDER))
    try:
        from run import CONTROLS, QUICK_STEPS
    finally:
        sys.path.remove(str(FOLDER))
    text = report.read_text()
    for name, control in CONTROLS.items():
        result = json.loads((out / name / "result.json").read_text())
        steps = [p["step"] for p in result["curve"]]
        assert steps == ([0, QUICK_STEPS] if control.steps else [0]), (name, steps)
        assert all(len(p["won_by_seed"]) == 4 for p in result["curve"]), name  # paired: every point's games
        assert f"| {name} |" in text, name
    assert "## What went wrong in the earlier grid, re-measured" in text
    assert (report.parent / "positive_controls_curves.png").stat().st_size > 0
    # a second run finds every result and trains nothing again
    again = subprocess.run([sys.executable, str(FOLDER / "run.py"), "--out", str(out), "--report", str(report), "--quick",
                            "--jobs", "0"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "done" not in again.stdout, again.stdout
