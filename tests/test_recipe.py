"""examples/recipe_textworld.py: its configs, and --quick end to end.

The quick run checks that every stage runs and writes well-formed results; whether the recipe
learns is measured by the full run (examples/RESULTS-recipe.md), not here.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
RECIPE = ROOT / "examples" / "recipe_textworld.py"
CONFIGS = ROOT / "examples" / "configs"


@pytest.fixture(scope="module")
def recipe():
    spec = importlib.util.spec_from_file_location("recipe_textworld", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shipped_configs_load_and_agree(recipe, tmp_path):
    sft, grpo = recipe.load_stage_configs(recipe.parse_args([]), 0, tmp_path, tmp_path / "demos.jsonl")
    assert (sft.objective.name, grpo.objective.name) == ("sft", "grpo")
    assert sft.train.demos == str(tmp_path / "demos.jsonl")
    assert grpo.model == str(tmp_path / "sft" / "checkpoints" / f"step-{sft.train.steps}")
    assert grpo.train.steps * grpo.rollout.tasks_per_step <= recipe.parse_args([]).demo_first_seed


def test_configs_that_would_not_compare_are_refused(recipe, tmp_path):
    from agentkit.core.errors import ConfigError

    args = recipe.parse_args(["--grpo-set", "env.max_turns=5"])
    with pytest.raises(ConfigError, match=r"env.max_turns differs between the SFT config \(8\) and the GRPO config \(5\)"):
        recipe.load_stage_configs(args, 0, tmp_path, tmp_path / "demos.jsonl")
    args = recipe.parse_args(["--demo-first-seed", "10"])
    with pytest.raises(ConfigError, match="raise --demo-first-seed above"):
        recipe.load_stage_configs(args, 0, tmp_path, tmp_path / "demos.jsonl")


@pytest.mark.slow
@pytest.mark.textworld
def test_quick_recipe_end_to_end(tmp_path):
    pytest.importorskip("textworld")
    out = tmp_path / "recipe"
    command = [sys.executable, str(RECIPE), "--out", str(out), "--quick", "--quiet"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]

    results = json.loads((out / "results.json").read_text())
    assert results["quick"] is True
    # the run records its resolved settings: the recipe's level over the environment's registered defaults
    assert results["env"] == {"id": "textworld/coin-v0", "kwargs": {"challenge": "tw-coin_collector", "level": 3},
                              "eval_split": "eval", "eval_episodes": 2, "max_turns": 3}
    (run,) = results["runs"]
    assert run["seed"] == 0
    for stage in ("init", "sft", "grpo"):
        assert 0.0 <= run[stage]["success_rate"] <= 1.0
        assert run[stage]["episodes"] == 2
        assert results["summary"][stage]["mean"] == run[stage]["success_rate"]
    assert set(run["wall_s"]) == {"model", "demos", "init_eval", "sft", "grpo"}
    assert results["versions"]["torch"]

    table = (out / "results.md").read_text()
    assert "| seed | random init | SFT | GRPO | wall time |" in table
    assert table.count("\n| 0 | ") == 1 and "| mean ± sd |" in table

    seed_dir = out / "seed-0"
    demos = [json.loads(line) for line in (seed_dir / "demos.jsonl").read_text().splitlines()]
    assert [d["seed"] for d in demos] == [10_000, 10_001] and all(d["won"] for d in demos)
    for stage in ("sft", "grpo"):
        assert (seed_dir / stage / "metrics.jsonl").exists() and (seed_dir / stage / "eval.jsonl").exists()

    model = out / "model"
    assert {"config.json", "model.safetensors", "tokenizer.json", "agentkit_model.json"} <= {p.name for p in model.iterdir()}
    assert not (model / "optimizer.safetensors").exists()
    info = json.loads((model / "agentkit_model.json").read_text())
    assert info["builder"] == "examples/recipe_textworld.py" and info["stage"] == "grpo" and info["size"] == "tiny"
    from agentkit.rollout.hf_backend import HFBackend

    HFBackend(model)  # a plain model folder that agentkit loads

    # a second run finds every stage done and reports the same numbers
    again = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    rerun = json.loads((out / "results.json").read_text())["runs"][0]
    assert all(rerun[s] == run[s] for s in ("init", "sft", "grpo"))
