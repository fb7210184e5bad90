"""Async training (``--async``) and pi_old from the trainer with importance correction.

The maths is pinned on hand-worked values; the loop runs for real: the CLI in a subprocess with a
real generator process and the SFT'd tiny student of conftest.py on amber vaults, killed with
``kill -9`` mid-run and resumed.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from agentkit.objectives.batch import TokenBatch
from agentkit.objectives.common import clipped_pg, off_policy_correction
from agentkit.objectives.grpo import GRPO, GRPOConfig

from agentkit.core.faults import VARIABLE
from agentkit.core.jsonl import read_trajectories

SETTINGS = ["env.id=vaults/vaults-v0", "env.kwargs.families=amber", "env.max_turns=3", "sampling.temperature=0.5",
            "rollout.tasks_per_step=1", "rollout.group_size=4", "objective.args.invalid_action_penalty=0.1", "eval.every=0", "eval.episodes=1",
            "checkpoint.every=1", "checkpoint.keep=5", "async_rl.generator_threads=1", "async_rl.trainer_threads=1"]


# -- the maths -------------------------------------------------------------------------------
def _batch() -> TokenBatch:
    """Two rows, distinct sampler (recorded) logprobs on three response tokens each."""
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    behaviour = torch.tensor([[0.0, -1.0, -2.0, -0.5], [-0.2, -3.0, -1.5, 0.0]])
    return TokenBatch(input_ids=torch.zeros((2, 5), dtype=torch.long), attention_mask=torch.ones((2, 5), dtype=torch.long),
                      response_mask=mask, old_logprobs=behaviour * mask,
                      advantages=torch.tensor([[0.0, 1.5, 1.5, 1.5], [-0.5, -0.5, -0.5, 0.0]]), weights=mask.clone(),
                      episode_index=torch.tensor([0, 1]), turn_index=torch.zeros((2, 4), dtype=torch.long)).with_normalizers()


# the trainer's pi_old: log-ratios to the sampler of +0.1, +1.0 (r = e), -0.3 / +0.05, -1.2 (r = 0.30), +0.4
TRAINER = torch.tensor([[0.0, -0.9, -1.0, -0.8], [-0.15, -4.2, -1.1, 0.0]])
LOG_R = [0.1, 1.0, -0.3, 0.05, -1.2, 0.4]  # over the response tokens, row-major


def test_truncated_importance_weights_and_mismatch_metrics():
    batch = off_policy_correction(_batch(), TRAINER, "truncate", 2.0)
    r = [math.exp(x) for x in LOG_R]
    got = batch.is_weights[batch.response_mask > 0].tolist()
    assert got == pytest.approx([min(x, 2.0) for x in r], rel=1e-6)
    assert batch.old_logprobs[batch.response_mask > 0].tolist() == pytest.approx([-0.9, -1.0, -0.8, -0.15, -4.2, -1.1])
    assert batch.behaviour_logprobs[batch.response_mask > 0].tolist() == pytest.approx([-1.0, -2.0, -0.5, -0.2, -3.0, -1.5])
    kl = sum(math.exp(x) - 1 - x for x in LOG_R) / 6  # k3 of KL(sampler || trainer)
    m = batch.metrics
    assert m["mismatch_kl"] == pytest.approx(kl, rel=1e-5)
    assert m["mismatch_logprob_abs"] == pytest.approx(sum(abs(x) for x in LOG_R) / 6, rel=1e-5)
    assert m["is_ratio_max"] == pytest.approx(math.e, rel=1e-6)
    assert m["is_ratio_min"] == pytest.approx(math.exp(-1.2), rel=1e-6)
    assert m["is_corrected_share"] == pytest.approx(1 / 6)  # e > 2: one token truncated
    assert torch.equal(batch.response_mask, _batch().response_mask)


def test_masked_importance_weights_reject_tokens_outside_the_band():
    batch = off_policy_correction(_batch(), TRAINER, "mask", 2.0)
    # r = e > 2 and r = e^-1.2 = 0.30 < 1/2 are rejected: out of the mask (loss and normalizer)
    assert batch.response_mask.tolist() == [[0.0, 1.0, 0.0, 1.0], [1.0, 0.0, 1.0, 0.0]]
    kept = [math.exp(x) for x in (0.1, -0.3, 0.05, 0.4)]
    assert batch.is_weights[batch.response_mask > 0].tolist() == pytest.approx(kept, rel=1e-6)
    assert batch.metrics["is_corrected_share"] == pytest.approx(2 / 6)
    plain = off_policy_correction(_batch(), TRAINER, "none", 2.0)
    assert torch.equal(plain.is_weights, plain.response_mask) and plain.metrics["is_corrected_share"] == 0


def test_grpo_loss_weighs_each_token_by_its_importance_weight():
    batch = off_policy_correction(_batch(), TRAINER, "truncate", 2.0)
    current = TRAINER + torch.tensor([[0.0, 0.1, -0.05, 0.3], [0.2, 0.02, -0.25, 0.0]])  # distinct from pi_old
    objective = GRPO(GRPOConfig(kl_coef=0.0, dual_clip=0.0))
    loss, _ = objective.loss(batch, current)
    expected, n = 0.0, 0
    for b in range(2):
        for t in range(4):
            if batch.response_mask[b, t] > 0:
                rho = math.exp(float(current[b, t] - TRAINER[b, t]))
                a = float(batch.advantages[b, t])
                w = min(math.exp(float(TRAINER[b, t] - _batch().old_logprobs[b, t])), 2.0)
                expected += w * -min(rho * a, min(max(rho, 0.8), 1.2) * a)
                n += 1
    assert float(loss) == pytest.approx(expected / n, rel=1e-5)
    unweighted, _ = clipped_pg(current, batch.old_logprobs, batch.advantages, 0.2, 0.2)
    weighted, _ = clipped_pg(current, batch.old_logprobs, batch.advantages, 0.2, 0.2, is_weights=batch.is_weights)
    assert torch.allclose(weighted, unweighted * batch.is_weights)


def test_off_policy_correction_refuses_unknown_settings():
    with pytest.raises(ValueError, match="unknown importance correction"):
        off_policy_correction(_batch(), TRAINER, "clip", 2.0)
    with pytest.raises(ValueError, match="above 1"):
        off_policy_correction(_batch(), TRAINER, "truncate", 1.0)


# -- the loop --------------------------------------------------------------------------------
def train_cli(out: Path, model: Path, *extra: str, steps: int = 4, fault: str | None = None, resume: bool = False):
    env = {k: v for k, v in os.environ.items() if k != VARIABLE}
    env["OMP_NUM_THREADS"] = "1"  # sync and async on the same kernels: the same floats, the same samples
    if fault is not None:
        env[VARIABLE] = fault
    command = [sys.executable, "-m", "agentkit.cli", "train", "--out", str(out), "--steps", str(steps), "--quiet",
               "--model", str(model), *[a for kv in SETTINGS for a in ("--set", kv)], *extra,
               *(["--resume"] if resume else [])]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)


def _generators() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if b"agentkit.train.async_rollout" in Path(f"/proc/{entry}/cmdline").read_bytes() or \
                        Path(f"/proc/{entry}/comm").read_text().strip() == "agentkit-generator":
                    found.append(int(entry))
            except OSError:
                continue
    return found


def _played(run: Path, step: int) -> list[tuple]:
    trajectories = read_trajectories(run / "trajectories" / f"step-{step}.jsonl", strict=True)
    return sorted((t.id, [turn.response_ids for turn in t.turns]) for t in trajectories)


@pytest.mark.slow  # 25-45 s here
def test_async_without_staleness_plays_what_sync_plays(tmp_path, vaults_sft_model):
    """max_staleness 0: every step starts from the weights of the step before, as in sync training; the
    generator's own copy of them plays the same episodes, token for token, and the update is the same."""
    sync = train_cli(tmp_path / "sync", vaults_sft_model, "--set", "train.old_logprobs=trainer", steps=3)
    assert sync.returncode == 0, sync.stderr
    run = train_cli(tmp_path / "async", vaults_sft_model, "--async", "--max-staleness", "0", steps=3)
    assert run.returncode == 0, run.stderr
    for step in (1, 2, 3):
        assert _played(tmp_path / "async", step) == _played(tmp_path / "sync", step)
        versions = {turn.policy_version for t in read_trajectories(tmp_path / "async" / "trajectories" / f"step-{step}.jsonl")
                    for turn in t.turns}
        assert versions == {step - 1}
    lines = [[json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()] for name in ("sync", "async")]
    assert any(r["grad_norm"] > 0 for r in lines[0])
    for a, b in zip(*lines, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6) and a["staleness_mean"] == b["staleness_mean"] == 0
        assert b["mismatch_kl"] < 1e-6 and "generator_play_s" in b


@pytest.mark.slow  # 25-45 s here
def test_async_run_killed_mid_update_resumes_without_losing_or_repeating_episodes(tmp_path, vaults_sft_model):
    run = tmp_path / "run"
    killed = train_cli(run, vaults_sft_model, "--async", "--max-staleness", "2", steps=5, fault="update@3")
    assert killed.returncode == -9, killed.stderr
    deadline = time.monotonic() + 10
    while _generators() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _generators(), "the generator outlived the killed trainer"
    whole = {p.name: p.read_bytes() for p in (run / "trajectories").glob("step-*.jsonl")}
    assert {"step-1.jsonl", "step-2.jsonl", "step-3.jsonl"} <= set(whole), sorted(whole)
    parts = {p.name: p.read_bytes() for p in (run / "trajectories").glob("step-*.jsonl.part")}
    resumed = train_cli(run, vaults_sft_model, "--async", "--max-staleness", "2", steps=5, resume=True)
    assert resumed.returncode == 0, resumed.stderr
    for name, data in whole.items():  # the buffer is trained on as it was: nothing played again
        assert (run / "trajectories" / name).read_bytes() == data, name
    for name, data in parts.items():  # a step cut short keeps its episodes and plays only the rest
        assert (run / "trajectories" / name.removesuffix(".part")).read_bytes().startswith(data), name
    for step in range(1, 6):  # every step whole: each of its episodes exactly once
        ids = [t.id for t in read_trajectories(run / "trajectories" / f"step-{step}.jsonl", strict=True)]
        assert len(ids) == len(set(ids)) == 4, (step, ids)
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5]
    assert not list((run / "trajectories").glob("*.part"))


@pytest.mark.slow  # 25-45 s here
def test_a_generator_that_dies_stops_the_run_and_resume_finishes_its_step(tmp_path, vaults_sft_model):
    run = tmp_path / "run"
    died = train_cli(run, vaults_sft_model, "--async", steps=3, fault="generator@2")
    assert died.returncode == 2 and "Traceback" not in died.stderr, died.stderr
    assert "agentkit: error: async generator: the generator process exited (code -9)" in died.stderr
    assert f"agentkit train --out {run} --resume" in died.stderr
    part = run / "trajectories" / "step-2.jsonl.part"
    written = part.read_bytes()
    assert len(written.splitlines()) == 1  # killed after its first episode of step 2
    resumed = train_cli(run, vaults_sft_model, "--async", steps=3, resume=True)
    assert resumed.returncode == 0, resumed.stderr
    whole = (run / "trajectories" / "step-2.jsonl").read_bytes()
    assert whole.startswith(written) and len(whole.splitlines()) == 4


@pytest.mark.parametrize(("values", "message"), [
    ({"objective.name": "sft", "train.demos": "x.jsonl"}, "trains on demonstrations"),
])
def test_async_refuses_what_it_cannot_do(values, message):
    from agentkit.train.config import load_config

    with pytest.raises(Exception, match=message):
        load_config(values={"async_rl.enabled": True, **values})
