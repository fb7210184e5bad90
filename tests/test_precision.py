"""bf16 mixed precision and gradient checkpointing (train.precision, train.gradient_checkpointing):
one real update against fp32's on the same batch, and the loop with both on."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
import torch

from agentkit.train.config import TrainConfig, TrainSection
from agentkit.train.distributed import SingleProcess


@pytest.fixture(scope="module")
def batch(backend):
    """Real vaults episodes of the tiny model (GRPO's batch), with distinct advantages per row (a
    random policy's equal returns would give zero advantages and no gradient)."""
    from agentkit.envs import ActionParser, make
    from agentkit.objectives import make_objective
    from agentkit.rollout import Collector, EpisodeSpec, SamplingParams

    collector = Collector(backend, lambda: make("vaults/vaults-v0", max_turns=3, action_parser=ActionParser()),
                          env_id="vaults/vaults-v0", sampling=SamplingParams(temperature=1.0, max_new_tokens=12))
    trajectories = []
    backend.reseed(5)
    collector.run([EpisodeSpec(seed, s) for seed in range(2) for s in range(3)], trajectories.append)
    collector.close()
    batch = make_objective("grpo", {"kl_coef": 0.0}).prepare(trajectories, None)
    per_row = torch.linspace(-0.7, 1.9, batch.num_rows)[:, None]  # both signs, unequal
    return replace(batch, advantages=per_row * batch.response_mask)


def one_update(model_dir, batch, **settings):
    """(loss, {name: weight change}, {name: gradient}) of one AdamW step of GRPO from the tiny model."""
    from agentkit.objectives import make_objective

    from agentkit.train import load_policy
    from agentkit.train.update import update

    section = TrainSection(lr=1e-5, **settings)
    policy = load_policy(model_dir, section).train()
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    grads: dict[str, torch.Tensor] = {}

    class Recording(torch.optim.AdamW):
        def step(self, closure=None):  # the gradients the update applies (after clipping)
            grads.update({name: p.grad.detach().clone() for name, p in policy.named_parameters()})
            return super().step(closure)

    optimizer = Recording(policy.parameters(), lr=section.lr)
    stats = update(policy, optimizer, make_objective("grpo", {"kl_coef": 0.0}), batch, train=section, ranks=SingleProcess(),
                   rng=random.Random(0), needs_support=False)
    assert all(p.dtype == torch.float32 for p in policy.parameters())  # fp32 master weights
    assert all(s["exp_avg_sq"].dtype == torch.float32 for s in optimizer.state.values())  # and optimizer state
    change = {name: p.detach() - before[name] for name, p in policy.named_parameters()}
    return stats.losses[0], change, grads


def flat(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.flatten() for _, t in sorted(tensors.items())])


def test_a_bf16_step_runs_in_bf16_and_stays_close_to_fp32(tiny_model_dir, batch):
    loss32, change32, grad32 = one_update(tiny_model_dir, batch)
    loss16, change16, grad16 = one_update(tiny_model_dir, batch, precision="bf16")
    assert loss16 != loss32  # the forward really ran in bf16
    assert loss16 == pytest.approx(loss32, rel=2e-2)
    g32, g16 = flat(grad32), flat(grad16)
    assert float(torch.nn.functional.cosine_similarity(g32, g16, dim=0)) > 0.99
    assert float(g16.norm() / g32.norm()) == pytest.approx(1.0, abs=0.03)
    # at lr 1e-5 a bf16 weight (8 bits of mantissa) would not move at all: fp32 master weights do, as fp32's
    c32, c16 = flat(change32), flat(change16)
    assert float(c16.abs().max()) > 5e-6
    assert float(torch.nn.functional.cosine_similarity(c32, c16, dim=0)) > 0.9
    assert float(c16.norm() / c32.norm()) == pytest.approx(1.0, abs=0.05)


def test_gradient_checkpointing_recomputes_and_gives_the_same_step(tiny_model_dir, batch):
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer

    calls = []
    original = Qwen3DecoderLayer.forward

    def counted(self, *args, **kwargs):
        calls.append(torch.is_grad_enabled())
        return original(self, *args, **kwargs)

    Qwen3DecoderLayer.forward = counted
    try:
        loss, change, grads = one_update(tiny_model_dir, batch)
        plain_calls, calls[:] = len(calls), []
        loss_ckpt, change_ckpt, grads_ckpt = one_update(tiny_model_dir, batch, gradient_checkpointing=True)
        checkpointed_calls = len(calls)
    finally:
        Qwen3DecoderLayer.forward = original
    assert checkpointed_calls == 2 * plain_calls  # each layer ran again in the backward pass
    assert loss_ckpt == pytest.approx(loss, rel=1e-6)
    assert torch.allclose(flat(grads_ckpt), flat(grads), atol=1e-7, rtol=1e-5)
    assert torch.allclose(flat(change_ckpt), flat(change), atol=1e-9)


SETTINGS = {"env": {"id": "vaults/vaults-v0", "max_turns": 3}, "rollout": {"tasks_per_step": 2, "group_size": 2},
            "sampling": {"max_new_tokens": 8}, "objective": {"name": "sdar", "args": {"kl_coef": 0.05}},
            "eval": {"every": 0, "episodes": 2}, "checkpoint": {"every": 0}}


def test_bf16_places_the_frozen_models_in_bf16_and_recomputes_pi_old(tiny_model_dir, tmp_path):
    from agentkit.train import setup

    cfg = TrainConfig.model_validate({**SETTINGS, "model": str(tiny_model_dir), "out": str(tmp_path / "run"),
                                      "teacher": {"spec": f"model:{tiny_model_dir}", "device": "cpu"},
                                      "train": {"steps": 1, "precision": "bf16", "gradient_checkpointing": True}})
    run = setup(cfg, resume=False, given=None)
    try:
        assert run.reference.dtype == torch.bfloat16 and run.teacher.model.dtype == torch.bfloat16
        assert run.policy.dtype == torch.float32 and run.policy.is_gradient_checkpointing
        assert run.trainer_old_logprobs  # auto: the cached decoding and the full forward round differently in bf16
        assert run.policy(input_ids=torch.tensor([[1, 2, 3]])).logits.dtype == torch.bfloat16
        assert run.reference(input_ids=torch.tensor([[1, 2, 3]])).logits.dtype == torch.bfloat16
    finally:
        run.close()
    fp32 = setup(cfg.model_copy(update={"train": TrainSection(steps=1), "out": str(tmp_path / "fp32")}),
                 resume=False, given=None)
    try:
        assert run.policy is not fp32.policy and fp32.reference.dtype == torch.float32
        assert not fp32.trainer_old_logprobs and not fp32.policy.is_gradient_checkpointing
        assert fp32.policy(input_ids=torch.tensor([[1, 2, 3]])).logits.dtype == torch.float32
    finally:
        fp32.close()


@pytest.mark.slow  # 14-30 s here: keeps the default run under 15 minutes
def test_the_loop_trains_in_bf16_with_checkpointing_from_the_flags(tiny_model_dir, tmp_path):
    import subprocess
    import sys

    import yaml

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({**SETTINGS, "teacher": {"spec": f"model:{tiny_model_dir}"}}))
    done = subprocess.run([sys.executable, "-m", "agentkit.cli", "train", "--config", str(config), "--quiet",
                           "--model", str(tiny_model_dir), "--out", str(tmp_path / "run"), "--steps", "2",
                           "--precision", "bf16", "--gradient-checkpointing", "--teacher-device", "cpu"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["mismatch_kl"] >= 0 and r["skipped_updates"] == 0 and r["loss"] == r["loss"] for r in records)
    saved = json.loads((tmp_path / "run" / "checkpoints" / "step-2" / "config.json").read_text())
    assert saved.get("dtype", saved.get("torch_dtype")) == "float32"  # the fp32 master weights are what is saved
    assert "precision: bf16" in (tmp_path / "run" / "config.yaml").read_text()


def test_an_unknown_precision_names_the_choices():
    with pytest.raises(ValueError, match="fp32.*bf16"):
        TrainConfig.model_validate({"train": {"precision": "fp16"}})
