"""Faults a run must absorb or stop on clearly: NaN/inf updates, environments that keep failing.

``FlakyEnv`` is a real environment plugin (loaded by import path, in this process and in worker
processes) whose step raises, or kills its worker, on the tasks chosen by ``fail``: the faults a
real simulator produces only now and then. NaN losses and overflowing gradients come from the
``AGENTKIT_FAULT`` testing hook (agentkit.core.faults): a real divergence is not reproducible on a
tiny model in a few steps (a learning rate of 1e30 saturates it to a zero gradient, not a NaN).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from agentkit.envs import ACTION_TAG, EnvSpec, make

from agentkit.core.errors import ConfigError, EnvError
from agentkit.core.faults import VARIABLE, fault_active

INFO = {"admissible_actions": None, "action_valid": True, "won": False, "score": 0.0, "privileged": None}


class FlakyEnv:
    """One-turn tasks: any answer ends the episode, rewarded by its length (so a group's returns
    differ and GRPO has a gradient). ``fail``: "none"; "all" or "odd" (the step raises on
    every task, or on odd task seeds); "die" (the step kills its process)."""

    def __init__(self, fail: str = "none", split: str = "train") -> None:
        self.fail, self.split, self.seed = fail, split, None

    def reset(self, *, seed=None, options=None):
        self.seed = seed
        return f"Task {seed}: say anything.", {**INFO, "task": f"task {seed}"}

    def step(self, action: str):
        if self.fail == "all" or (self.fail == "odd" and self.seed % 2):
            raise RuntimeError(f"simulator crashed on task {self.seed}")
        if self.fail == "die":
            os._exit(3)
        reward = len(action) / 10
        return "Done.", reward, True, False, {**INFO, "task": f"task {self.seed}", "won": reward > 2, "score": reward}

    def close(self) -> None:
        pass


# the step sees the model's whole text: the <action> format's prompt and stop string, but no parser
FLAKY_SPEC = EnvSpec(FlakyEnv, action_format=dataclasses.replace(ACTION_TAG, parser=None))
ENV_ID = f"{FlakyEnv.__module__}:FLAKY_SPEC"  # the import-path form of an environment id


# -- the hook ---------------------------------------------------------------------------------
def test_the_fault_hook_fires_only_where_named(monkeypatch):
    monkeypatch.delenv(VARIABLE, raising=False)
    assert not fault_active("loss.nan", 1)
    monkeypatch.setenv(VARIABLE, "checkpoint.write@2, loss.nan")
    assert fault_active("checkpoint.write", 2) and not fault_active("checkpoint.write", 3)
    assert fault_active("loss.nan", 7) and not fault_active("update", 2)
    monkeypatch.setenv(VARIABLE, "update@two")
    with pytest.raises(ConfigError, match=r"'update@two' should be NAME or NAME@STEP"):
        fault_active("update", 2)


def test_a_fault_point_kills_its_process_like_kill_9():
    code = "from agentkit.core.faults import fault_point; fault_point('update', 2); print('survived')"
    env = {k: v for k, v in os.environ.items() if k != VARIABLE}
    spared = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**env, VARIABLE: "update@3"})
    assert spared.returncode == 0 and "survived" in spared.stdout
    killed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**env, VARIABLE: "update@2"})
    assert killed.returncode == -signal.SIGKILL and "survived" not in killed.stdout


# -- environments that keep failing -----------------------------------------------------------
def _collector(backend, envs, *, limit: int, max_in_flight: int = 0, max_new_tokens: int = 4):
    from agentkit.rollout import Collector, SamplingParams

    return Collector(backend, envs, env_id=ENV_ID, sampling=SamplingParams(max_new_tokens=max_new_tokens, seed=1),
                     max_consecutive_errors=limit, max_in_flight=max_in_flight)


@pytest.mark.parametrize(("workers", "fail", "error"), [
    (0, "all", "RuntimeError: simulator crashed on task"),
    (1, "all", "RuntimeError: simulator crashed on task"),
    (1, "die", "its worker process died"),
])
def test_an_env_failing_n_episodes_in_a_row_stops_the_rollout(backend, workers, fail, error):
    from agentkit.rollout import EpisodeSpec
    from agentkit.rollout.runners import make_env_runner

    envs = make_env_runner(functools.partial(make, ENV_ID, max_turns=2, fail=fail), workers)
    collector = _collector(backend, envs, limit=3)
    written = []
    try:
        with pytest.raises(EnvError, match=rf"(?s){re.escape(ENV_ID)}' failed 3 episodes in a row .*{error}.*"
                                           rf"agentkit envs check"):
            collector.run([EpisodeSpec(seed) for seed in range(8)], written.append)
    finally:
        collector.close()
    assert len(written) == 3 and all(error in t.error and t.truncated for t in written), "the failed episodes are written"


@pytest.mark.parametrize("workers", [0, 1])
def test_an_env_failing_now_and_then_does_not_stop_the_rollout(backend, workers):
    from agentkit.rollout import EpisodeSpec
    from agentkit.rollout.runners import make_env_runner

    envs = make_env_runner(functools.partial(make, ENV_ID, max_turns=2, fail="odd"), workers)
    collector = _collector(backend, envs, limit=2, max_in_flight=1)  # one at a time: a fixed order
    written = []
    try:
        stats = collector.run([EpisodeSpec(seed) for seed in range(6)], written.append)
    finally:
        collector.close()
    failed = sorted(t.seed for t in written if t.error)
    assert stats.episodes == 6 and stats.errors == 3 and failed == [1, 3, 5]
    assert collector.consecutive_errors == 1, "each success reset the count; task 5 failed last"


def test_a_full_context_is_not_an_env_error(backend):
    from agentkit.rollout import EpisodeSpec

    collector = _collector(backend, functools.partial(make, ENV_ID, max_turns=2), limit=1,
                           max_new_tokens=backend.max_context)  # no answer fits
    written = []
    collector.run([EpisodeSpec(seed) for seed in range(3)], written.append)
    collector.close()
    assert [t.error for t in written] == ["context full"] * 3 and collector.consecutive_errors == 0
    with pytest.raises(ConfigError, match="max_consecutive_errors must be >= 0"):
        _collector(backend, functools.partial(make, ENV_ID), limit=-1)


FLAKY = [f"env.id={ENV_ID}", "env.kwargs={}", "env.max_turns=2", "rollout.tasks_per_step=1", "rollout.group_size=4",
         "sampling.max_new_tokens=8", "eval.every=0", "eval.episodes=2", "checkpoint.every=1", "checkpoint.keep=3"]


def test_training_stops_after_n_env_failures_in_a_row_counted_across_steps(tiny_model_dir, tmp_path):
    from agentkit.core.jsonl import read_trajectories
    from agentkit.train import train
    from agentkit.train.config import load_config

    run = tmp_path / "run"
    cfg = load_config(None, [*FLAKY, "env.kwargs.fail=all", "rollout.group_size=2", "env.max_errors=3",
                             "train.steps=3", f"model={tiny_model_dir}", f"out={run}"])
    with pytest.raises(EnvError, match="failed 3 episodes in a row"):
        train(cfg, show_progress=False)
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1]
    assert all(t.error for t in read_trajectories(run / "trajectories" / "step-1.jsonl"))
    assert len(read_trajectories(run / "trajectories" / "step-2.jsonl.tmp")) == 1, "step 2's failed episode is kept"


# -- NaN and inf ------------------------------------------------------------------------------
def _weights(run: Path, step: int):
    from safetensors.torch import load_file

    return load_file(str(run / "checkpoints" / f"step-{step}" / "model.safetensors"))


def _same(a, b) -> bool:
    import torch

    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("fault", ["loss.nan", "grad.inf"])
def test_a_non_finite_update_is_skipped_counted_and_the_run_goes_on(tiny_model_dir, tmp_path, monkeypatch, fault):
    """Steps 1 and 3 have a NaN loss (or a finite loss with an inf gradient): their updates are
    skipped and counted; step 2's finite update resets the count, so max_bad_updates=2 never trips."""
    import math

    from safetensors.torch import load_file

    from agentkit.train import train
    from agentkit.train.config import load_config

    run = tmp_path / "run"
    monkeypatch.setenv(VARIABLE, f"{fault}@1,{fault}@3")
    train(load_config(None, [*FLAKY, "train.steps=3", "train.max_bad_updates=2", f"model={tiny_model_dir}",
                                 f"out={run}"]), show_progress=False)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["skipped_updates"] for m in metrics] == [1, 0, 1]
    assert math.isnan(metrics[0]["loss"]) and math.isfinite(metrics[1]["loss"]) and metrics[1]["grad_norm"] > 0
    initial = load_file(str(tiny_model_dir / "model.safetensors"))
    assert _same(initial, _weights(run, 1)), "a skipped update never reaches the weights"
    assert not _same(_weights(run, 1), _weights(run, 2)), "a finite update does"
    assert _same(_weights(run, 2), _weights(run, 3))


def test_n_non_finite_updates_in_a_row_stop_the_run_with_a_clear_error(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, VARIABLE: "loss.nan",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-m", "agentkit.cli", "train", "--out", str(run), "--model", str(tiny_model_dir), "--steps", "4",
         "--quiet",
         *[a for kv in [*FLAKY, "train.max_bad_updates=2"] for a in ("--set", kv)]],
        capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 2, result.stderr
    assert "agentkit: error: 2 updates in a row had a NaN or inf loss or gradient (the last at step 2;" in result.stderr
    assert "lower train.lr" in result.stderr and "Traceback" not in result.stderr
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["skipped_updates"]) for m in metrics] == [(1, 1), (2, 1)], "the last line is written first"
    from agentkit.train.checkpoint import checkpoints

    assert checkpoints(run) == [1]
