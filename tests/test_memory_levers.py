"""benchmarks/memory_levers.py (the memory and time figures of bf16, checkpointing and LoRA, and the
GPU script's step and longest-episode parts) runs end to end on a tiny model (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    __import__("importlib.util").util.find_spec("peft") is None, reason="needs peft (pip install 'agentkit[lora]')")]

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "memory_levers.py"


def test_every_configuration_steps_and_reports_its_memory(tmp_path):
    results = tmp_path / "step.jsonl"
    done = subprocess.run([sys.executable, str(SCRIPT), "--size", "tiny", "--rows", "2", "--tokens", "32", "--steps", "1",
                           "--warmup", "0", "--results", str(results)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "AGENTKIT_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["config"]: r for r in map(json.loads, results.read_text().splitlines())}
    assert len(rows) == 6 and "| LoRA r16 bf16 + checkpointing |" in done.stdout
    full, lora = rows["full fp32"], rows["LoRA r16 fp32"]
    assert full["trained_parameters"] == full["parameters"] > lora["trained_parameters"] > 0
    # AdamW keeps two fp32 moments per trained parameter (and a step count)
    assert full["optimizer_gb"] * 1e9 >= 8 * full["trained_parameters"] > lora["optimizer_gb"] * 1e9
    assert all(r["peak_gb"] > 0 and r["step_s"] > 0 for r in rows.values())


def test_the_longest_update_that_fits_stops_at_the_cap(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--size", "tiny", "--longest", "--tokens", "32", "--max-tokens",
                           "64", "--configs", "full bf16 + checkpointing"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "AGENTKIT_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "full bf16 + checkpointing: longest update that fits: 64 tokens (fails at None)" in done.stdout
