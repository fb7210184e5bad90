"""``agentkit train --env ID --steps 1`` with default settings works for every registered
environment: the real command in a subprocess, nothing else given (environment defaults from the
registration, the shipped default policy). Slow: it generates each family's games."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from agentkit.envs import REGISTRY, status

# needs files only its user has (WebShop's original data): it must say so, in one line
NEEDS_USER_DATA = {"webshop/original-v0": "WEBSHOP_DATA"}
# Families whose default step costs minutes get fewer episodes: every code path the defaults take, at a
# budget that keeps CI short. ScienceWorld's default turn limit (300, for its longest expert plan) at ~7
# steps/s of its JVM makes one default step about half an hour of episodes the untrained policy never
# ends; ALFWorld's planner (~8 steps/s on a large game) took 181 s and ScienceWorld 174 s even so, and
# TextWorld generates a game per task (~3 s each: tw-simple 102 s, cooking 70 s). The default
# environment (textworld/coin-v0) and the cheap families keep every default.
FEWER = ["--tasks-per-step", "2", "--eval-episodes", "2"]
BUDGET = {"scienceworld/scienceworld-v0": ["--max-turns", "12", *FEWER], "alfworld/alfworld-v0": ["--max-turns", "12", *FEWER],
          "textworld/simple-v0": FEWER, "textworld/cooking-v0": FEWER, "textworld/treasure-v0": FEWER}


@pytest.mark.slow
@pytest.mark.parametrize("env_id", sorted(spec.name for spec in REGISTRY.specs() if not spec.name.startswith("testing/")))
def test_train_one_step_with_default_settings(env_id, tmp_path):
    row = {row.id: row for row in status()}[env_id]  # imports each family's packages: not at collection
    if not row.available:
        pytest.skip(f"{env_id} is not installed here: {row.detail}")
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in NEEDS_USER_DATA.values()}
    result = subprocess.run([sys.executable, "-m", "agentkit.cli", "train", "--env", env_id, "--steps", "1",
                             "--out", str(out), "--quiet", *BUDGET.get(env_id, [])], capture_output=True, text=True, timeout=1800, env=env)
    if env_id in NEEDS_USER_DATA:
        assert result.returncode == 2, result.stderr
        assert NEEDS_USER_DATA[env_id] in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert not out.exists()  # refused before the run folder was written
        return
    assert result.returncode == 0, result.stderr[-3000:]
    assert "at the end (step 1)" in result.stdout and "checkpoint:" in result.stdout, result.stdout
    assert (out / "checkpoints" / "step-1" / "COMPLETE").exists()
