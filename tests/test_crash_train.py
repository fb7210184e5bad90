"""``kill -9`` during ``agentkit train``, then ``--resume``: the run ends as if never interrupted.

Each test runs the real CLI in a subprocess with ``AGENTKIT_FAULT`` (agentkit.core.faults), which
makes the process SIGKILL itself at a named moment: mid-rollout, mid-update, mid-checkpoint-write.
Then it checks that no half-written checkpoint looks complete, resumes without the hook, and
compares weights, metrics, evaluations and trajectories with an uninterrupted run of the same
config. GRPO from the SFT'd tiny student of conftest.py on amber vaults (vaults/vaults-v0) at
temperature 0.5, where its episodes get different distances: the updates are real (non-zero
gradients).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentkit.core.errors import ConfigError
from agentkit.core.faults import VARIABLE
from agentkit.train.checkpoint import MARKER, check_complete, checkpoints

STEPS = 3
SETTINGS = ["env.id=vaults/vaults-v0", "env.kwargs.families=amber", "env.max_turns=3", "sampling.temperature=0.5",
            "rollout.tasks_per_step=1", "rollout.group_size=4", "train.minibatches=2", "objective.args.invalid_action_penalty=0.1", "eval.every=2", "eval.episodes=1",
            "checkpoint.every=1", "checkpoint.keep=3"]


def train_cli(out: Path, *, model: Path | None = None, fault: str | None = None, resume: bool = False,
              steps: int = STEPS):
    env = {k: v for k, v in os.environ.items() if k != VARIABLE}
    if fault is not None:
        env[VARIABLE] = fault
    command = [sys.executable, "-m", "agentkit.cli", "train", "--out", str(out), "--steps", str(steps), "--quiet",
               *(["--model", str(model)] if model is not None else []),
               *[arg for kv in SETTINGS for arg in ("--set", kv)], *(["--resume"] if resume else [])]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run / "checkpoints" / f"step-{step}" / "model.safetensors"))


def _lines(run: Path, name: str) -> list[dict]:
    """Records without timing fields (they differ between any two runs)."""
    rows = [json.loads(line) for line in (run / name).read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.endswith("_s") and k != "rollout_tokens_per_s"} for r in rows]


def _played(run: Path, step: int) -> list[tuple]:
    """What the policy did in a step: per episode its id, response tokens and rewards."""
    from agentkit.core.jsonl import read_trajectories

    trajectories = read_trajectories(run / "trajectories" / f"step-{step}.jsonl", strict=True)
    return sorted((t.id, [turn.response_ids for turn in t.turns], [turn.reward for turn in t.turns])
                  for t in trajectories)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, vaults_sft_model) -> Path:
    """The uninterrupted run."""
    run = tmp_path_factory.mktemp("crash") / "reference"
    result = train_cli(run, model=vaults_sft_model)
    assert result.returncode == 0, result.stderr
    assert checkpoints(run) == [1, 2, 3]
    from safetensors.torch import load_file

    initial = load_file(str(vaults_sft_model / "model.safetensors"))
    final = _weights(run, STEPS)
    assert not all(torch.equal(initial[k], final[k]) for k in final), "the run changed the policy"
    assert any(r["grad_norm"] > 0 for r in _lines(run, "metrics.jsonl"))
    return run


@pytest.mark.parametrize(
    ("fault", "complete"),
    [
        # after step 3's first trajectory was written
        pytest.param("rollout@3", [1, 2], marks=pytest.mark.slow, id="mid-rollout"),
        # after a backward, before its optimizer step
        pytest.param("update@3", [1, 2], marks=pytest.mark.slow, id="mid-update"),
        # step 2's model files written, its optimizer state and marker not
        pytest.param("checkpoint.write@2", [1], id="mid-checkpoint-write"),
        # before the first checkpoint is complete: --resume plays the run again from step 0
        pytest.param("checkpoint.write@1", [], marks=pytest.mark.slow, id="before-the-first-checkpoint"),
    ],
)
def test_kill_9_then_resume_equals_the_uninterrupted_run(reference, vaults_sft_model, tmp_path, fault, complete):
    run = tmp_path / "run"
    killed = train_cli(run, model=vaults_sft_model, fault=fault)
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    # what the crash left: only whole checkpoints count as checkpoints
    assert checkpoints(run) == complete
    for step in complete:
        check_complete(run / "checkpoints" / f"step-{step}")
    point, _, at = fault.partition("@")
    if point == "checkpoint.write":
        (partial,) = (run / "checkpoints").glob(f".step-{at}-*")
        assert (partial / "model.safetensors").exists() and not (partial / "optimizer.safetensors").exists()
        assert not (partial / MARKER).exists() and not (run / "checkpoints" / f"step-{at}").exists()
    if point == "rollout":
        written = (run / "trajectories" / f"step-{at}.jsonl.tmp").read_text().splitlines()
        assert 1 <= len(written) < 4, "killed mid-rollout: some of the step's episodes written, not all"
    metrics_before = len(_lines(run, "metrics.jsonl"))
    assert metrics_before == (int(at) if point == "checkpoint.write" else int(at) - 1)

    resumed = train_cli(run, resume=True)
    assert resumed.returncode == 0, resumed.stderr
    assert checkpoints(run) == [1, 2, 3]
    for step in (2, 3):
        a, b = _weights(reference, step), _weights(run, step)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f"step-{step} weights differ"
    assert _lines(run, "metrics.jsonl") == _lines(reference, "metrics.jsonl")
    assert _lines(run, "eval.jsonl") == _lines(reference, "eval.jsonl")
    for step in range(1, STEPS + 1):
        assert _played(run, step) == _played(reference, step)
    leftovers = [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    leftovers += [p.name for p in (run / "trajectories").iterdir() if not p.name.endswith(".jsonl")]
    assert not leftovers, f"temporary files of the killed run remain: {leftovers}"


def test_a_checkpoint_with_a_file_deleted_is_refused_naming_the_file(reference, tmp_path):
    """A folder with its marker but a file gone was damaged from outside (agentkit never leaves
    one): resume refuses it, naming the file and the earlier checkpoint, and loads nothing."""
    from agentkit.train import train
    from agentkit.train.config import load_config

    run = tmp_path / "run"
    shutil.copytree(reference, run)
    (run / "checkpoints" / "step-3" / "tokenizer.json").unlink()  # listed by the marker only
    metrics = (run / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match=r"step-3 is damaged: missing tokenizer.json\. .* resume from step 2"):
        train(load_config(None, [f"out={run}", "train.steps=4"]), resume=True, show_progress=False)
    assert (run / "metrics.jsonl").read_text() == metrics, "nothing of the run was touched"

    (run / "checkpoints" / "step-2" / "model.safetensors").write_bytes(b"truncated")
    with pytest.raises(ConfigError, match="model.safetensors changed size since it was written"):
        check_complete(run / "checkpoints" / "step-2")

    result = train_cli(run, resume=True, steps=4)  # the CLI: exit code 2, the message, no traceback
    assert result.returncode == 2 and "missing tokenizer.json" in result.stderr and "Traceback" not in result.stderr

