"""LoRA (train.lora, peft): every objective trains an adapter alone; checkpoints hold the adapter;
eval and rollout load base + adapter; the reference, the self-teacher and a teacher that is the
base read the policy's own weights; resume is exact; bf16 and async combine with it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from agentkit.core.errors import ConfigError
from agentkit.train import setup, train
from agentkit.train.config import load_config

pytest.importorskip("peft")

# amber vaults with the SFT'd tiny model at temperature 0.5: about half its actions are valid, so a
# group's returns differ and GRPO has a gradient (conftest's vaults_sft_model)
BASE = ["env.id=vaults/vaults-v0", "env.kwargs.families=amber", "env.max_turns=4", "eval.episodes=2", "eval.every=0",
        "rollout.tasks_per_step=2", "rollout.group_size=4", "sampling.temperature=0.5", "sampling.max_new_tokens=12",
        "checkpoint.every=1", "train.lora.rank=4", "train.lr=1e-2"]
PENALTY = "objective.args.invalid_action_penalty=0.1"  # unequal returns in a group: GRPO has a gradient
NEEDS = {  # what each objective needs besides the policy
    "sft": ["train.demos={demos}"],
    "opd": ["teacher.spec=model:{teacher}"],
    "sage_opd": ["teacher.spec=model:{teacher}", "objective.args.judge=oracle"],
    "grpo": ["objective.args.kl_coef=0.05", PENALTY],  # the reference: the base, adapter off
    **{name: [PENALTY] for name in ("sdar", "grpo_opsd", "grpo_opsd_rkl", "rlsd", "skill_sd", "skill_grpo")},
}


def config(tmp_path, objective, student, demos, *extra, steps=1, teacher=None):
    settings = [*BASE, f"objective.name={objective}", f"model={student}", f"out={tmp_path / objective}",
                f"train.steps={steps}",
                *(s.format(demos=demos, teacher=teacher or student) for s in NEEDS.get(objective, [])), *extra]
    return load_config(None, settings)


def adapter(run) -> dict[str, torch.Tensor]:
    steps = sorted(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("step-*"))
    return load_file(str(run / "checkpoints" / f"step-{steps[-1]}" / "adapter_model.safetensors"))


@pytest.mark.parametrize("objective", ["grpo", "sft", "opd", "opsd", "opsd_rkl", "grpo_opsd", "grpo_opsd_rkl", "sdar",
                                       "rlsd", "sage_opd", "skill_sd", "skill_grpo"])
def test_every_objective_trains_the_adapter_alone(objective, vaults_sft_model, vaults_demos, tiny_model_dir, tmp_path):
    # the model teacher is another model (a teacher equal to the base would have no gap to distill at the start)
    cfg = config(tmp_path, objective, vaults_sft_model, vaults_demos, teacher=tiny_model_dir)
    run = setup(cfg, resume=False, given=None)
    try:
        trained = [p for p in run.policy.parameters() if p.requires_grad]
        assert trained and all(".lora_" in n for n, p in run.policy.named_parameters() if p.requires_grad)
        assert sum(p.numel() for p in trained) < 0.2 * sum(p.numel() for p in run.policy.parameters())
        assert [p for group in run.optimizer.param_groups for p in group["params"]] == trained
        if run.teacher is not None and run.teacher.name == "self":  # the policy itself: base + adapter
            assert run.teacher.model is run.policy
        if run.reference is not None:  # the policy with its adapter off, no second copy
            assert run.reference.policy is run.policy
    finally:
        run.close()
    result = train(cfg, show_progress=False)
    checkpoint = result.checkpoint
    assert (checkpoint / "adapter_model.safetensors").exists() and not (checkpoint / "model.safetensors").exists()
    saved = adapter(result.run_dir)
    assert saved and all(".lora_" in name for name in saved)
    moved = [name for name, t in saved.items() if "lora_B" in name and float(t.abs().max()) > 0]
    assert moved, "the update moved the adapter"  # B starts at 0
    metrics = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["skipped_updates"] == 0 and metrics[-1]["loss"] == metrics[-1]["loss"]


def test_a_teacher_that_is_the_base_reads_the_policys_own_weights(vaults_sft_model, vaults_demos, tmp_path):
    from agentkit.train.lora import BaseView

    run = setup(config(tmp_path, "opd", vaults_sft_model, vaults_demos), resume=False, given=None)
    try:
        assert isinstance(run.teacher.model, BaseView) and run.teacher.model.policy is run.policy
        ids = torch.tensor([[1, 40, 77, 12, 9, 300]])
        with torch.no_grad():
            for p in run.policy.parameters():
                if p.requires_grad:
                    p.add_(0.05)  # an adapter that changes the output
            adapted, base = run.policy(input_ids=ids).logits, run.teacher.model(input_ids=ids).logits
        from agentkit.rollout.hf_backend import load_causal_lm

        plain = load_causal_lm(vaults_sft_model)(input_ids=ids).logits.detach()
        assert torch.allclose(base, plain, atol=1e-5) and not torch.allclose(adapted, plain, atol=1e-3)
    finally:
        run.close()


@pytest.mark.slow  # 14-30 s here: keeps the default run under 15 minutes
def test_a_checkpoint_is_the_adapter_and_loads_as_base_plus_adapter(vaults_sft_model, vaults_demos, tmp_path):
    from agentkit.rollout.hf_backend import load_causal_lm

    result = train(config(tmp_path, "grpo", vaults_sft_model, vaults_demos, steps=2), show_progress=False)
    checkpoint = result.checkpoint
    full = (vaults_sft_model / "model.safetensors").stat().st_size
    assert (checkpoint / "adapter_model.safetensors").stat().st_size < full / 3
    # the base is frozen: the adapter is all that changed
    run = setup(config(tmp_path, "grpo", vaults_sft_model, vaults_demos, steps=3).model_copy(update={"out": str(result.run_dir)}),
                resume=True, given=None)
    try:
        base = load_file(str(vaults_sft_model / "model.safetensors"))
        ours = {n.replace("base_model.model.", "").replace(".base_layer", ""): p
                for n, p in run.policy.named_parameters() if not p.requires_grad}
        assert all(torch.equal(ours[name], tensor) for name, tensor in base.items() if name in ours)
        ids = torch.tensor([[1, 40, 77, 12, 9, 300]])
        with torch.no_grad():
            adapted = run.policy(input_ids=ids).logits
            merged = load_causal_lm(checkpoint)(input_ids=ids).logits  # what eval and rollout load
            plain = load_causal_lm(vaults_sft_model)(input_ids=ids).logits
        assert torch.allclose(merged, adapted, atol=1e-5) and not torch.allclose(merged, plain, atol=1e-3)
    finally:
        run.close()
    for command in (["eval", "--episodes", "2"], ["rollout", "--episodes", "2", "--out", str(tmp_path / "r.jsonl")]):
        done = subprocess.run([sys.executable, "-m", "agentkit.cli", *command, "--model", str(result.run_dir),
                               "--env", "vaults/vaults-v0", "--env-kwargs", "families=amber", "--max-turns", "3"],
                              capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]


def test_lora_resume_is_exact(vaults_sft_model, vaults_demos, tmp_path):
    straight = train(config(tmp_path / "a", "sdar", vaults_sft_model, vaults_demos, steps=2), show_progress=False).run_dir
    cfg = config(tmp_path / "b", "sdar", vaults_sft_model, vaults_demos, steps=1)
    train(cfg, show_progress=False)
    resumed = train(cfg.model_copy(update={"train": cfg.train.model_copy(update={"steps": 2})}), resume=True,
                    show_progress=False).run_dir
    a, b = adapter(straight), adapter(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    lines = [[{k: v for k, v in json.loads(line).items() if not k.endswith("_s") and "per_s" not in k}
              for line in (run / "metrics.jsonl").read_text().splitlines()] for run in (straight, resumed)]
    assert lines[0] == lines[1]


def test_lora_with_bf16_keeps_the_base_in_bf16_and_the_adapter_in_fp32(vaults_sft_model, vaults_demos, tmp_path):
    cfg = config(tmp_path, "grpo", vaults_sft_model, vaults_demos, "train.precision=bf16", "train.gradient_checkpointing=true")
    run = setup(cfg, resume=False, given=None)
    try:
        assert {p.dtype for p in run.policy.parameters() if p.requires_grad} == {torch.float32}
        assert {p.dtype for p in run.policy.parameters() if not p.requires_grad} == {torch.bfloat16}
    finally:
        run.close()
    result = train(cfg, show_progress=False)
    assert {t.dtype for t in adapter(result.run_dir).values()} == {torch.float32}


def test_async_sends_the_generator_the_adapter_alone(vaults_sft_model, vaults_demos, tmp_path):
    cfg = config(tmp_path, "grpo", vaults_sft_model, vaults_demos, "async_rl.enabled=true", steps=3)
    result = train(cfg, show_progress=False)
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3] and records[-1]["staleness_max"] <= 1
    from agentkit.train.async_rollout import Generator  # noqa: F401 - the shared tensors are trainable_state's
    from agentkit.train.lora import trainable_state

    run = setup(config(tmp_path, "grpo", vaults_sft_model, vaults_demos, steps=1).model_copy(update={"out": str(tmp_path / "x")}),
                resume=False, given=None)
    try:
        shared = trainable_state(run.policy)
        assert shared and all(".lora_" in name for name in shared)
    finally:
        run.close()


def test_bad_lora_settings_are_one_line_with_the_fix(vaults_sft_model, vaults_demos, tmp_path):
    with pytest.raises(ConfigError, match="no linear layer named qkv_fused.*its linear layers are"):
        setup(config(tmp_path, "grpo", vaults_sft_model, vaults_demos, "train.lora.target_modules=[qkv_fused]"), resume=False,
              given=None)


def test_merged_weights_are_what_an_engine_without_lora_serves(vaults_sft_model, vaults_demos, tmp_path):
    """What a vLLM engine receives (``MergedWeights``): loaded into a plain copy of the base model,
    it computes what the adapted policy does; the policy's own weights are left as they were."""
    from agentkit.rollout.hf_backend import load_causal_lm

    from agentkit.train.lora import MergedWeights

    run = setup(config(tmp_path, "grpo", vaults_sft_model, vaults_demos), resume=False, given=None)
    try:
        with torch.no_grad():
            for name, p in run.policy.named_parameters():
                if p.requires_grad:
                    p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
        before = {n: p.detach().clone() for n, p in run.policy.named_parameters()}
        merged = dict(MergedWeights(run.policy).named_parameters())
        plain = load_causal_lm(vaults_sft_model)
        assert set(dict(plain.named_parameters())) <= set(merged)  # the base model's own names
        missing, unexpected = plain.load_state_dict(merged, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embedding
        ids = torch.tensor([[1, 40, 77, 12, 9, 300]])
        with torch.no_grad():
            adapted, served = run.policy(input_ids=ids).logits, plain(input_ids=ids).logits
            base = load_causal_lm(vaults_sft_model)(input_ids=ids).logits
        assert torch.allclose(served, adapted, atol=1e-5) and not torch.allclose(served, base, atol=1e-3)
        assert all(torch.equal(p, before[n]) for n, p in run.policy.named_parameters())
    finally:
        run.close()
