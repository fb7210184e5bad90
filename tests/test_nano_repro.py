"""examples/nano_repro/run.py --quick runs every stage and every objective variant on TextWorld, and the
report it writes has a row per variant, the stage table, the diagnostics and a verdict per claim."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("textworld")

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "nano_repro" / "run.py"


def _run():
    """The example's run.py under a name of its own: examples/vaults_bench has a run.py too."""
    spec = importlib.util.spec_from_file_location("nano_repro_run", SCRIPT)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.textworld
def test_quick_grid_writes_a_report_with_every_row(tmp_path):
    VARIANTS = _run().VARIANTS
    out, report = tmp_path / "grid", tmp_path / "report" / "nano_repro.md"
    command = [sys.executable, str(SCRIPT), "--out", str(out), "--report", str(report), "--quick",
               "--envs", "textworld", "--seeds", "0", "--jobs", "0"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    results = json.loads((out / "results.json").read_text())
    runs = results["envs"]["textworld"]["runs"]
    assert sorted(r["variant"] for r in runs) == sorted(VARIANTS)
    for run in runs:
        assert 0.0 <= run["eval"]["eval"]["success_rate"] <= 1.0 and run["eval"]["eval"]["episodes"] == 1
    by_variant = {r["variant"]: r["diagnostics"] for r in runs}
    assert {"gate_mean", "negative_gap_share"} <= set(by_variant["sdar-random"])
    assert {"judge_skip_share", "confidence_mean"} <= set(by_variant["sage_opd"])

    # the hinted demonstrations start with the privileged block exactly as the self-teacher renders it
    from agentkit.rollout.hf_backend import load_tokenizer

    from agentkit.core.jsonl import read_trajectories

    tokenizer = load_tokenizer(out / "textworld" / "model-init")
    demos = read_trajectories(out / "textworld" / "demos.jsonl")
    hinted = [d for d in demos if d.id.endswith("|hinted")]
    assert hinted and len(hinted) < len(demos)
    first = tokenizer.decode(hinted[0].turns[0].context_ids)
    assert "[Privileged Skill Information]" in first and "Expert plan from here:" in first

    text = report.read_text()
    for variant in VARIANTS:
        assert f"| {variant} | 1 |" in text, variant
    for heading in ("| random init |", "| SFT (start of every RL run) |", "Gate diagnostics", "Turn-label diagnostics",
                    "SDAR beats GRPO even with random retrieval", "SAGE-OPD beats OPD", "opsd collapse"):
        assert heading in text, heading
    assert (report.parent / "nano_repro_textworld.png").stat().st_size > 0


@pytest.mark.textworld
@pytest.mark.parametrize("context", ["chat", "window"])
def test_hinted_demos_carry_the_block_where_the_self_teacher_puts_it(tiny_model_dir, context):
    """chat: once, in front of the episode's one growing sequence; window: in front of every turn's prompt."""
    import dataclasses
    import random

    run = _run()
    ENVS, PRIVILEGED, expert_games, hinted = run.ENVS, run.PRIVILEGED, run.expert_games, run.hinted
    from agentkit.rollout.hf_backend import load_tokenizer
    from agentkit.skillbank import SkillBank, default_bank_for, resolve_bank
    from agentkit.teachers.model import ModelTeacher

    setup = dataclasses.replace(ENVS["textworld"], kwargs={"level": 103, "goal": "brief"}, context=context, window=1)
    tokenizer = load_tokenizer(tiny_model_dir)
    (game,) = expert_games(setup, tokenizer, split="train", seeds=[0])
    assert "Find the coin and take it." in tokenizer.decode(game.turns[0].context_ids)
    bank = SkillBank.load(resolve_bank(default_bank_for(setup.env_id)))
    shown = hinted(game, tokenizer, bank, random.Random(0))
    (block,) = ModelTeacher(None, tokenizer, name="self", privileged=PRIVILEGED, bank=bank).prefixes([shown])
    assert "Expert plan from here: " + " > ".join(t.action for t in game.turns) in tokenizer.decode(block)
    assert len(shown.skills) == 3 and len(game.turns) >= 3
    for i, (plain, with_block) in enumerate(zip(game.turns, shown.turns, strict=True)):
        if i == 0 or context == "window":
            assert with_block.context_ids == block + plain.context_ids
        else:
            assert with_block.context_ids == plain.context_ids
        assert with_block.response_ids == plain.response_ids
