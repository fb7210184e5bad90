"""The training loop end to end on a CPU: real tiny model, real TextWorld games, real files."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentkit.core.errors import AgentkitError, ConfigError
from agentkit.train import train
from agentkit.train.config import load_config

pytestmark = pytest.mark.textworld
pytest.importorskip("textworld")

COIN1 = ["env.id=textworld/coin-v0", "env.kwargs.level=1", "env.max_turns=3", "eval.episodes=4"]


def _params(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_one_sft_step_changes_every_parameter_and_writes_the_run_folder(tiny_model_dir, demos, tmp_path):
    run = tmp_path / "run"
    cfg = load_config(None, [*COIN1, "objective.name=sft", f"train.demos={demos}", "train.steps=1",
                             f"model={tiny_model_dir}", f"out={run}"])
    train(cfg, show_progress=False)
    before, after = _params(tiny_model_dir), _params(run / "checkpoints" / "step-1")
    assert before.keys() == after.keys()
    unchanged = [name for name in before if torch.equal(before[name], after[name])]
    assert not unchanged, f"parameters not updated by one step: {unchanged}"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert set(metrics[0]) >= {"step", "loss", "return_mean", "success_rate", "tokens", "nll"}
    assert (run / "eval.jsonl").exists() and (run / "config.yaml").exists()
    assert (run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_warmup_scales_the_first_steps_lr_in_the_optimizer(tiny_model_dir, demos, tmp_path):
    """AdamW's first step moves each weight by about lr (m/sqrt(v) = +-1), so the largest weight change
    of step 1 measures the lr the optimizer used: lr / warmup_steps, not lr."""
    from agentkit.train.update import step_lr

    run = tmp_path / "run"
    train(load_config(None, [*COIN1, "objective.name=sft", f"train.demos={demos}", "train.steps=1", "train.lr=1e-3",
                             "train.warmup_steps=4", "eval.at_start=false", f"model={tiny_model_dir}", f"out={run}"]),
          show_progress=False)
    before, after = _params(tiny_model_dir), _params(run / "checkpoints" / "step-1")
    moved = max(float((after[name] - before[name]).abs().max()) for name in before)
    assert moved == pytest.approx(2.5e-4, rel=0.02), moved
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[0])["lr"] == pytest.approx(2.5e-4)
    settings = load_config(None, ["train.lr=1e-3", "train.warmup_steps=4"]).train
    assert [step_lr(settings, s) for s in range(6)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    assert step_lr(load_config(None, ["train.lr=1e-3"]).train, 0) == 1e-3


def test_the_run_evaluates_its_start_and_reports_start_and_end(sft_model, tmp_path, capsys):
    from agentkit.train import TrainResult

    run = tmp_path / "run"
    result = train(load_config(None, [*COIN1, "objective.name=grpo", "rollout.tasks_per_step=2", "rollout.group_size=2",
                                      "eval.every=0", "train.steps=1", f"model={sft_model}", f"out={run}"]))
    evals = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 1] and evals[0]["episodes"] == 4
    assert "eval at the start (step 0, eval split, 4 greedy episodes): success" in capsys.readouterr().err
    assert result.start_eval == evals[0] and result.final_eval["step"] == 1
    assert re.search(r"success \d+\.\d% \[.*\] at the start \(step 0\), \d+\.\d% \[.*\] at the end \(step 1\)",
                     result.summary())
    assert re.search(r"change [+-]\d+\.\d% \[.*\] \(95%, paired over 4 tasks\)", result.summary())
    assert evals[0]["won_by_seed"] == [int(w) for w in evals[0]["won_by_seed"]] and len(evals[0]["won_by_seed"]) == 4
    # the verdict follows the paired interval: 10 tasks, 6 of them won only at the end -> +60% [+28.0%, +92.0%]
    start = {"step": 0, "split": "dev", "episodes": 10, "success_rate": 0.1, "won_by_seed": [1] + [0] * 9}
    end = {**start, "step": 9, "success_rate": 0.7, "won_by_seed": [1] * 7 + [0] * 3}
    noise = {**start, "step": 9, "success_rate": 0.2, "won_by_seed": [0, 1, 1] + [0] * 7}
    verdict = {name: TrainResult(run, 9, b, None, start_eval=a).summary()
               for name, (a, b) in {"up": (start, end), "down": (end, start), "noise": (start, noise)}.items()}
    assert "change +60.0% [+28.0%, +92.0%] (95%, paired over 10 tasks): the policy improved" in verdict["up"]
    assert "change -60.0% [-92.0%, -28.0%] (95%, paired over 10 tasks): the policy got worse" in verdict["down"]
    assert "change +10.0% [-25.2%, +45.2%] (95%, paired over 10 tasks): no change shown" in verdict["noise"]
    one = {**start, "episodes": 1, "won_by_seed": [0]}  # one task has no interval: said, never [-inf, +inf]
    alone = TrainResult(run, 9, {**one, "won_by_seed": [1]}, None, start_eval=one).summary()
    assert "change +100% on one task: no interval" in alone and "inf" not in alone
    resumed = train(load_config(None, [*COIN1, "objective.name=grpo", "rollout.tasks_per_step=2", "rollout.group_size=2",
                                       "eval.every=0", "train.steps=2", f"model={sft_model}", f"out={run}"]),
                    resume=True, show_progress=False)
    assert [json.loads(line)["step"] for line in (run / "eval.jsonl").read_text().splitlines()] == [0, 1, 2]
    assert resumed.start_eval == evals[0], "a resumed run keeps its start's evaluation"


@pytest.mark.slow  # 14-30 s here: keeps the default run under 15 minutes
def test_sft_learns_the_task(sft_model, tmp_path):
    from agentkit.rollout.config import RolloutConfig
    from agentkit.rollout.run import run_rollout

    cfg = RolloutConfig(env={"id": "textworld/coin-v0", "kwargs": {"level": 1}, "max_turns": 3, "workers": 0},
                        split="eval", episodes=8, sampling={"temperature": 0.0}, out=str(tmp_path / "e.jsonl"))
    stats, _ = run_rollout(cfg, sft_model)
    assert stats.success_rate >= 0.75, "12 SFT steps teach 'take coin' on held-out level-1 games"
    result = subprocess.run([sys.executable, "-m", "agentkit.cli", "eval", "--env", "textworld/coin-v0", "--model",
                             str(sft_model), "--episodes", "4", "--max-turns", "3", "--env-workers", "0",
                             "--env-kwargs", "level=1"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "greedy" in result.stdout and "success rate" in result.stdout


GRPO = [*COIN1, "objective.name=grpo", "objective.args.invalid_action_penalty=0.1", "objective.args.kl_coef=0.01",
        "sampling.temperature=0.3", "rollout.tasks_per_step=2", "rollout.group_size=4", "eval.every=2",
        "checkpoint.every=2", "train.minibatches=2"]


def test_resume_equals_uninterrupted_run(sft_model, tmp_path):
    whole, split = tmp_path / "whole", tmp_path / "split"
    train(load_config(None, [*GRPO, f"model={sft_model}", f"out={whole}", "train.steps=4"]), show_progress=False)
    train(load_config(None, [*GRPO, f"model={sft_model}", f"out={split}", "train.steps=2"]), show_progress=False)
    train(load_config(None, [*GRPO, f"model={sft_model}", f"out={split}", "train.steps=4"]), resume=True,
          show_progress=False)
    a, b = _params(whole / "checkpoints" / "step-4"), _params(split / "checkpoints" / "step-4")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], _params(sft_model)[k]) for k in a), "GRPO updated the policy"

    def lines(run, name):
        rows = [json.loads(line) for line in (run / name).read_text().splitlines()]
        return [{k: v for k, v in r.items() if not k.endswith("_s") and k != "rollout_tokens_per_s"} for r in rows]

    assert lines(whole, "metrics.jsonl") == lines(split, "metrics.jsonl")
    assert lines(whole, "eval.jsonl") == lines(split, "eval.jsonl")
    assert any(r["grad_norm"] > 0 for r in lines(whole, "metrics.jsonl"))


def test_resets_started_ahead_change_nothing_but_when_they_run(sft_model, tmp_path):
    """env.reset_ahead (default on): with env workers, the next step's games reset while this step
    trains; the run is the same, episode for episode and (to float rounding) weight for weight."""
    from agentkit.core.jsonl import read_trajectories

    for name, ahead in (("on", "true"), ("off", "false")):
        train(load_config(None, [*GRPO, f"model={sft_model}", f"out={tmp_path / name}", "train.steps=3",
                                 "env.workers=2", f"env.reset_ahead={ahead}"]), show_progress=False)

    def played(run, step):
        return sorted((t.id, t.task, [(turn.observation, turn.response_ids) for turn in t.turns])
                      for t in read_trajectories(run / "trajectories" / f"step-{step}.jsonl", strict=True))

    for step in (1, 2, 3):
        assert played(tmp_path / "on", step) == played(tmp_path / "off", step)
    # with workers, generate calls batch episodes as they come back, so the recorded logprobs (and the
    # update) agree to float rounding, not bit for bit
    a, b = _params(tmp_path / "on" / "checkpoints" / "step-3"), _params(tmp_path / "off" / "checkpoints" / "step-3")
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5


def test_half_written_checkpoint_is_never_loaded(sft_model, tmp_path):
    run = tmp_path / "run"
    train(load_config(None, [*GRPO, f"model={sft_model}", f"out={run}", "train.steps=2"]), show_progress=False)
    # a crash mid-write leaves a temporary folder, and a step folder without its marker
    (run / "checkpoints" / ".step-3-abc").mkdir()
    (run / "checkpoints" / "step-3").mkdir()
    (run / "checkpoints" / "step-3" / "config.json").write_text("{}")
    from agentkit.train.checkpoint import checkpoints

    assert checkpoints(run) == [2]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.lrr=1e-4"], r"unknown key 'train.lrr'. Did you mean 'lr'"),
        (["trian.lr=1e-4"], r"unknown key 'trian'. Did you mean 'train'"),
        (["objective.name=grpo", "rollout.group_size=1"], "group_size must be >= 2"),
        (["objective.name=gpro"], "Did you mean 'grpo'"),
        (["objective.args.clip_lo=0.1"], r"clip_lo.*Extra inputs"),
        (["train.lr=-1"], r"--lr \(train.lr\): Input should be greater than 0"),
        (["train.lr"], "expects section.key=value"),
    ],
)
def test_bad_config_is_a_clear_error(overrides, message):
    with pytest.raises(AgentkitError, match=message):
        load_config(None, overrides)


@pytest.mark.slow  # 14-30 s here: keeps the default run under 15 minutes
def test_yaml_config_and_run_folder_guards(tmp_path, tiny_model_dir, demos):
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        load_config(bad)
    good = tmp_path / "good.yaml"
    good.write_text(f"objective:\n  name: sft\ntrain:\n  demos: {demos}\n  steps: 1\nenv:\n  kwargs: {{level: 1}}\n")
    cfg = load_config(good, ["train.lr=1e-3"], {"out": str(tmp_path / "run"), "model": str(tiny_model_dir)})
    assert cfg.train.lr == 1e-3 and cfg.train.steps == 1 and cfg.objective.name == "sft"
    with pytest.raises(ConfigError, match="no config.yaml; nothing to resume"):
        train(cfg, resume=True, show_progress=False)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.txt").write_text("x")
    with pytest.raises(ConfigError, match="already exists and is not empty"):
        train(cfg, show_progress=False)
    assert (tmp_path / "run" / "keep.txt").read_text() == "x"


@pytest.mark.slow  # 14-30 s here: keeps the default run under 15 minutes
def test_external_objective_plugin_trains(tiny_model_dir, demos, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(site), str(Path(__file__).parent / "plugin_objective")], check=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    listed = subprocess.run([sys.executable, "-m", "agentkit.cli", "objectives", "list"], capture_output=True, text=True, env=env)
    assert "weighted_sft" in listed.stdout and "agentkit-objective-demo" in listed.stdout
    # one column for the descriptions, however long a name (grpo_opsd_rkl) is
    assert len({re.match(r"\S+\s+", line).end() for line in listed.stdout.splitlines()}) == 1, listed.stdout
    run = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "agentkit.cli", "train", "--objective", "weighted_sft", "--demos", str(demos), "--model",
         str(tiny_model_dir), "--out", str(run), "--steps", "2", "--quiet", "--set", "objective.args.turn_bonus=1.0",
         *[a for kv in COIN1 for a in ("--set", kv)]],
        capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and metrics[0]["weighted_nll"] > 0 and "mean_weight" in metrics[0]


def test_train_cli_errors_are_clear(tmp_path):
    result = subprocess.run([sys.executable, "-m", "agentkit.cli", "train", "--objective", "gpro", "--out", str(tmp_path / "r")],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "Did you mean 'grpo'" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "r").exists()
