"""`agentkit train` under torchrun and accelerate launch: two ranks on CPU (gloo) make the update
one process makes, to float rounding; the ranks stay identical; the run folder is the same."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentkit.train import train
from agentkit.train.config import load_config

pytestmark = pytest.mark.textworld
pytest.importorskip("textworld")
pytest.importorskip("accelerate")

DRIVER = str(Path(__file__).with_name("distributed_driver.py"))
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
# The shipped default model on level-3 games: some episodes win and some do not, so GRPO has work.
# Four episodes in three minibatches (2, 1, 1): in two of them one rank has no episode at all.
SETTINGS = ["env.id=textworld/coin-v0", "env.kwargs.level=3", "env.max_turns=4", "env.workers=0",
            "eval.episodes=2", "eval.every=0", "checkpoint.every=1", "objective.name=grpo",
            "objective.args.kl_coef=0.01", "objective.args.invalid_action_penalty=0.1", "sampling.temperature=1.0",
            "rollout.tasks_per_step=2", "rollout.group_size=2", "train.minibatches=3", "seed=3"]
# seed 3: both steps have won and lost episodes (gradient norms ~0.9 and ~1.3). With seed 0 every
# step-1 episode is won, so the update is the KL term alone, whose gradient is float noise (~1e-6 on
# two ranks, 0.0 in one process) that AdamW scales up to lr-sized steps: no test of equality.
TOLERANCE = 1e-5  # float rounding: each rank sums its own rows' gradients before they are averaged


def _cli(out: Path, steps: int = 2) -> list[str]:
    return ["--out", str(out), "--steps", str(steps), "--quiet", *[a for kv in SETTINGS for a in ("--set", kv)]]


def _launch(command: list[str], **env: str) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def _params(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors") if path.is_dir() else str(path))


def _max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _lines(run: Path, name: str = "metrics.jsonl") -> list[dict]:
    rows = [json.loads(line) for line in (run / name).read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.endswith("_s") and k != "rollout_tokens_per_s"} for r in rows]


def _matches_one_process(run: Path, single: Path, label: str) -> None:
    from agentkit.models import ensure_default_model

    ours, theirs = _params(run / "checkpoints" / "step-2"), _params(single / "checkpoints" / "step-2")
    difference = _max_difference(ours, theirs)
    print(f"{label}: max |parameter difference| vs one process = {difference:.3g}")
    assert difference < TOLERANCE
    assert _max_difference(theirs, _params(ensure_default_model())) > 100 * TOLERANCE, "GRPO moved the weights"
    a, b = _lines(run), _lines(single)
    assert len(a) == len(b) == 2
    for mine, one in zip(a, b, strict=True):
        assert mine.keys() == one.keys()
        assert mine["success_rate"] == one["success_rate"] and mine["tokens"] == one["tokens"]
        assert mine["loss"] == pytest.approx(one["loss"], rel=1e-4, abs=1e-6)
        assert mine["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
    assert {r["success_rate"] for r in a} != {0.0}, "some episodes are won"
    for step in (1, 2):
        ids = [json.loads(line)["id"] for line in (run / "trajectories" / f"step-{step}.jsonl").read_text().splitlines()]
        ids_single = [json.loads(line)["id"] for line in
                      (single / "trajectories" / f"step-{step}.jsonl").read_text().splitlines()]
        assert sorted(ids) == sorted(ids_single)


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("one-process") / "run"
    train(load_config(None, [*SETTINGS, f"out={run}", "train.steps=2"]), show_progress=False)
    return run


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    """torchrun, two ranks; each rank leaves its final weights in rank-R.safetensors."""
    folder = tmp_path_factory.mktemp("torchrun")
    _launch([*TORCHRUN, DRIVER, str(folder), "train", *_cli(folder / "run")])
    return folder


def test_torchrun_matches_one_process_and_the_ranks_agree(single, two_ranks):
    rank0, rank1 = _params(two_ranks / "rank-0.safetensors"), _params(two_ranks / "rank-1.safetensors")
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0), "the ranks' weights drifted apart"
    saved = _params(two_ranks / "run" / "checkpoints" / "step-2")
    assert all(torch.equal(saved[k], rank0[k]) for k in saved)
    _matches_one_process(two_ranks / "run", single, "torchrun")
    assert not list((two_ranks / "run").glob("**/*rank*")), "one run folder, written by the main process"


@pytest.mark.slow  # 25-45 s here
def test_a_two_rank_checkpoint_resumes_under_torchrun_and_in_one_process(single, two_ranks, tmp_path):
    run, copy = tmp_path / "run", tmp_path / "copy"
    _launch([*TORCHRUN, "-m", "agentkit.cli", "train", *_cli(run, steps=1)])
    shutil.copytree(run, copy)
    _launch([*TORCHRUN, "-m", "agentkit.cli", "train", "--resume", *_cli(run, steps=2)])
    whole = two_ranks / "run"
    a, b = _params(run / "checkpoints" / "step-2"), _params(whole / "checkpoints" / "step-2")
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed = uninterrupted, bit for bit"
    assert _lines(run) == _lines(whole)
    # the same checkpoint, continued by one process
    train(load_config(None, [*SETTINGS, f"out={copy}", "train.steps=2"]), resume=True, show_progress=False)
    _matches_one_process(copy, single, "2 ranks, then resumed in one process")


@pytest.mark.slow  # 14-30 s here: keeps the default run under 15 minutes
def test_a_one_process_checkpoint_resumes_under_torchrun(single, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(single, run)
    shutil.rmtree(run / "checkpoints" / "step-2")  # as if it had stopped after step 1
    _launch([*TORCHRUN, "-m", "agentkit.cli", "train", "--resume", *_cli(run, steps=2)])
    _matches_one_process(run, single, "1 process, then resumed on 2 ranks")


@pytest.mark.slow  # 14-30 s here: keeps the default run under 15 minutes
def test_accelerate_launch_matches_one_process(single, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "accelerate.yaml"  # no GPU here: the loop asks accelerate for CPU (gloo) itself
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_machines: 1\n"
                      f"num_processes: 2\nmachine_rank: 0\nmain_process_port: {port}\nmixed_precision: 'no'\n"
                      "dynamo_config: {}\nuse_cpu: false\n")
    run = tmp_path / "run"
    _launch([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
             "-m", "agentkit.cli", "train", *_cli(run)])
    _matches_one_process(run, single, "accelerate launch")


@pytest.mark.parametrize("problem", ["run folder", "accumulation"])
def test_a_refused_run_fails_on_every_rank_with_the_same_message(problem, tmp_path):
    run = tmp_path / "run"
    env = dict(os.environ)
    if problem == "run folder":
        run.mkdir()
        (run / "keep.txt").write_text("x")
        message = f"agentkit: error: Run folder {run} already exists and is not empty"
    else:  # what `accelerate launch --gradient_accumulation_steps 2` sets
        env["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] = "2"
        message = "agentkit: error: accelerate's gradient_accumulation_steps is 2"
    result = subprocess.run([*TORCHRUN, "-m", "agentkit.cli", "train", *_cli(run)], capture_output=True, text=True,
                            timeout=600, env=env)
    assert result.returncode != 0
    assert (result.stdout + result.stderr).count(message) == 2, result.stderr[-4000:]
    assert not (run / "config.yaml").exists()


@pytest.mark.slow
def test_fsdp2_matches_one_process_and_resumes(single, tmp_path):
    """FSDP2 (fully_shard) over gloo. accelerate turns FSDP on for GPUs only, so the driver switches
    it on for these CPU ranks; everything after that is the loop's own FSDP path."""
    whole, split = tmp_path / "whole", tmp_path / "split"
    _launch([*TORCHRUN, DRIVER, str(tmp_path), "train", *_cli(whole)], AGENTKIT_TEST_FSDP2="1")
    rank0, rank1 = _params(tmp_path / "rank-0.safetensors"), _params(tmp_path / "rank-1.safetensors")
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0)
    _matches_one_process(whole, single, "FSDP2")
    _launch([*TORCHRUN, DRIVER, str(tmp_path), "train", *_cli(split, steps=1)], AGENTKIT_TEST_FSDP2="1")
    _launch([*TORCHRUN, DRIVER, str(tmp_path), "train", "--resume", *_cli(split)], AGENTKIT_TEST_FSDP2="1")
    a, b = _params(split / "checkpoints" / "step-2"), _params(whole / "checkpoints" / "step-2")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _lines(split) == _lines(whole)


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["ddp", "fsdp2"])
def test_bf16_and_gradient_checkpointing_train_on_two_ranks(sharding, tmp_path):
    """The memory levers with DDP and with FSDP2 over gloo: the ranks end with identical fp32
    weights that GRPO moved, and the losses are finite (bf16 samples differ from one process's, so
    the run is not compared with it)."""
    from agentkit.models import ensure_default_model

    run = tmp_path / "run"
    _launch([*TORCHRUN, DRIVER, str(tmp_path), "train", *_cli(run), "--precision", "bf16", "--gradient-checkpointing"],
            **({"AGENTKIT_TEST_FSDP2": "1"} if sharding == "fsdp2" else {}))
    rank0, rank1 = _params(tmp_path / "rank-0.safetensors"), _params(tmp_path / "rank-1.safetensors")
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0)
    saved = _params(run / "checkpoints" / "step-2")
    assert all(t.dtype == torch.float32 for t in saved.values())
    assert _max_difference(saved, _params(ensure_default_model())) > 100 * TOLERANCE, "GRPO moved the weights"
    records = _lines(run)
    assert len(records) == 2 and all(r["skipped_updates"] == 0 and r["mismatch_kl"] >= 0 for r in records)


@pytest.mark.slow
def test_lora_trains_the_same_adapter_on_two_ranks_and_fsdp_is_refused(tmp_path):
    """train.lora with DDP over gloo: only the adapter trains, identically on both ranks, and the
    checkpoint is the adapter. Under FSDP2 it is refused on every rank with one line."""
    pytest.importorskip("peft")
    refused = subprocess.run([*TORCHRUN, DRIVER, str(tmp_path), "train", *_cli(tmp_path / "fsdp"), "--lora-rank", "4"],
                             capture_output=True, text=True, timeout=600, env={**os.environ, "AGENTKIT_TEST_FSDP2": "1"})
    assert refused.returncode != 0 and "train.lora with FSDP" in refused.stdout + refused.stderr
    run = tmp_path / "run"
    _launch([*TORCHRUN, DRIVER, str(tmp_path), "train", *_cli(run), "--lora-rank", "4", "--set", "train.lr=1e-2"])
    rank0, rank1 = _params(tmp_path / "rank-0.safetensors"), _params(tmp_path / "rank-1.safetensors")
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0)
    adapter = _params(run / "checkpoints" / "step-2" / "adapter_model.safetensors")
    assert adapter and all(".lora_" in k for k in adapter)
    assert any("lora_B" in k and float(t.abs().max()) > 0 for k, t in adapter.items()), "GRPO moved the adapter"
    assert not (run / "checkpoints" / "step-2" / "model.safetensors").exists()
    base = _params(ensure_default_model_weights())
    held = {k.replace("base_model.model.", "").replace(".base_layer", ""): t for k, t in rank0.items() if ".lora_" not in k}
    assert all(torch.equal(held[k], base[k]) for k in base if k in held)  # the base stayed frozen


def ensure_default_model_weights() -> Path:
    from agentkit.models import ensure_default_model

    return ensure_default_model() / "model.safetensors"
