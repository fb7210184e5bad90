"""Every distillation objective trains for a couple of steps on real TextWorld games (and SDAR on
ALFWorld), logs its diagnostics, records retrieved skills, and resumes exactly."""

from __future__ import annotations

import json

import pytest
import yaml

from agentkit.core.jsonl import read_trajectories
from agentkit.train import train
from agentkit.train.config import load_config

pytestmark = pytest.mark.textworld
pytest.importorskip("textworld")

BASE = ["env.id=textworld/coin-v0", "env.kwargs.level=1", "env.max_turns=3", "eval.episodes=2", "eval.every=0",
        "rollout.tasks_per_step=2", "rollout.group_size=2", "sampling.temperature=0.5", "sampling.max_new_tokens=12",
        "train.steps=2", "checkpoint.every=1"]
DIAGNOSTICS = {
    "opd": {"reverse_kl", "teacher_logprob_mean", "full_kl"},  # the default estimator: full
    "opsd": {"gate_mean", "gap_mean", "negative_gap_share", "sdar_loss", "kl"},
    "opsd_rkl": {"reverse_kl", "teacher_logprob_mean"},
    "grpo_opsd": {"gate_mean", "gap_mean", "negative_gap_share", "sdar_loss"},
    "grpo_opsd_rkl": {"reverse_kl", "distill_loss", "grpo_loss", "kl"},
    "sdar": {"gate_mean", "gate_above_half", "gap_mean", "negative_gap_share", "kl"},
    "sage_opd": {"judge_skip_share", "judge_weak_share", "judge_strong_share", "judge_check_share",
                 "judge_unparseable_share", "confidence_mean", "Z"},
    "rlsd": {"weight_mean", "weight_clipped_share", "gap_mean", "rlsd_lambda"},
    "skill_sd": {"distill_k3", "distill_loss", "gap_mean"},
    "skill_grpo": {"pg_loss", "clip_fraction"},
}


def run(tmp_path, objective, student, *extra):
    out = tmp_path / objective
    cfg = load_config(None, [*BASE, f"objective.name={objective}", f"model={student}", f"out={out}",
                             "objective.args.invalid_action_penalty=0.1" if objective in (
                                 "sdar", "grpo_opsd", "grpo_opsd_rkl", "rlsd", "skill_sd", "skill_grpo") else "seed=0",
                             *extra])
    train(cfg, show_progress=False)
    return out, [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("objective", sorted(DIAGNOSTICS))
def test_each_objective_trains_and_logs_its_diagnostics(objective, sft_model, tiny_model_dir, tmp_path):  # noqa: F811
    extra = [f"teacher.spec=model:{tiny_model_dir}"] if objective in ("opd", "sage_opd") else []
    if objective == "sage_opd":
        extra.append("sampling.temperature=0.1")  # near-greedy: the short-SFT'd student makes valid moves
    out, metrics = run(tmp_path, objective, sft_model, *extra)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert DIAGNOSTICS[objective] <= set(m), sorted(DIAGNOSTICS[objective] - set(m))
        assert m["loss"] == m["loss"] and m["skipped_updates"] == 0  # finite
    trajectories = read_trajectories(out / "trajectories" / "step-1.jsonl")
    uses_skills = objective not in ("opd", "sage_opd")
    assert all(bool(t.skills) == uses_skills for t in trajectories)
    if uses_skills:
        bank = yaml.safe_load((out / "skillbank.yaml").read_text())
        assert bank["episodes"] == 2 * 4  # every training episode credited to its skills
        played = trajectories + read_trajectories(out / "trajectories" / "step-2.jsonl")
        assert sum(s["stats"]["uses"] for s in bank["skills"]) == sum(len(t.skills) for t in played)
        rewards = sum(s["stats"]["reward_sum"] for s in bank["skills"])
        if objective == "skill_grpo":  # the policy sees its skills: they are credited with the return
            assert rewards == pytest.approx(sum(t.episode_return * len(t.skills) for t in played))
        else:  # only the teacher does: with its lift signed by the outcome, in [0, 1] (agentkit.train.skill_credit)
            assert all(0 <= s["stats"]["reward_sum"] <= s["stats"]["uses"] for s in bank["skills"])
    if objective == "skill_grpo":  # the policy itself reads the skills
        from agentkit.rollout.hf_backend import load_tokenizer

        assert all(t.skills_in_prompt for t in trajectories)
        assert "[Skills]" in load_tokenizer(sft_model).decode(trajectories[0].turns[0].context_ids)
    if objective == "sage_opd":
        shares = [metrics[0][f"judge_{x}_share"] for x in ("skip", "weak", "strong")]
        assert sum(shares) == pytest.approx(1.0)
        assert metrics[0]["judge_check_share"] < 1.0, "the SFT'd student makes valid moves, which the judge is asked about"


def test_opd_full_topk_and_sage_oracle(sft_model, tiny_model_dir, tmp_path):  # noqa: F811
    _, metrics = run(tmp_path, "opd", sft_model, f"teacher.spec=model:{tiny_model_dir}",
                     "objective.args.estimator=full", "objective.args.topk=8")
    assert all(m["full_kl"] >= 0 for m in metrics)
    _, metrics = run(tmp_path / "o", "sage_opd", sft_model, f"teacher.spec=model:{tiny_model_dir}",
                     "objective.args.judge=oracle")
    assert metrics[0]["judge_unparseable_share"] == 0.0


def test_sdar_resume_restores_the_skill_bank_statistics(sft_model, tmp_path):  # noqa: F811
    whole, split = tmp_path / "whole", tmp_path / "split"
    common = [*BASE, "objective.name=sdar", f"model={sft_model}", "skills.retrieval=ucb"]
    train(load_config(None, [*common, f"out={whole}"]), show_progress=False)
    train(load_config(None, [*common, f"out={split}", "train.steps=1"]), show_progress=False)
    train(load_config(None, [*common, f"out={split}"]), resume=True, show_progress=False,
          given={"train.steps": 2})  # resuming keeps the saved length (1) unless the length is given
    assert (whole / "skillbank.yaml").read_text() == (split / "skillbank.yaml").read_text()

    def lines(run):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if not k.endswith("_s") and k != "rollout_tokens_per_s"} for r in rows]

    assert lines(whole) == lines(split)


def test_distillation_config_errors():
    from agentkit.core.errors import ConfigError, UnknownNameError

    # no teacher given is no error: the run takes the default teacher (tests/test_default_teacher.py)
    assert load_config(None, ["objective.name=sage_opd"]).teacher.spec is None
    with pytest.raises(UnknownNameError, match="Did you mean 'keyword'"):
        load_config(None, ["objective.name=sdar", "skills.retrieval=keywrd"])
    with pytest.raises(ConfigError, match="privileged"):
        load_config(None, ["objective.name=sdar", "teacher.privileged=[hints]"])


@pytest.mark.java
def test_sdar_on_alfworld(tiny_model_dir, tmp_path):
    pytest.importorskip("alfworld")
    out = tmp_path / "alf"
    cfg = load_config(None, ["env.id=alfworld/alfworld-v0", "env.kwargs={}", "env.max_turns=2", "eval.episodes=1",
                             "rollout.tasks_per_step=1", "rollout.group_size=2", "sampling.max_new_tokens=8",
                             "train.steps=1", "objective.name=sdar", "skills.retrieval=keyword", "teacher.privileged=[skills, env]",
                             f"model={tiny_model_dir}", f"out={out}"])
    train(cfg, show_progress=False)
    (m,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {"gate_mean", "negative_gap_share"} <= set(m)
    trajectories = read_trajectories(out / "trajectories" / "step-1.jsonl")
    assert all(t.skills and all(s.startswith("alf.") for s in t.skills) for t in trajectories)
    from agentkit.envs.alfworld.env import TASK_TYPES

    from agentkit.report.view import collect

    assert all(t.task_type in TASK_TYPES for t in trajectories)  # recorded from the env's info
    assert {e["type"] for e in collect(out)["episodes"]} == {t.task_type for t in trajectories}  # the viewer's filter
    signals = [json.loads(line) for line in (out / "signals" / "step-1.jsonl").read_text().splitlines()]
    assert signals and all("gate" in turn for record in signals for turn in record["turns"])


def test_help_config_lists_every_setting_and_the_objectives_args(capsys):
    from agentkit.cli import main

    assert main(["train", "--help-config", "--objective", "sage_opd"]) == 0
    out = capsys.readouterr().out
    for key in ("teacher.spec", "teacher.privileged", "skills.retrieval", "train.lr", "objective.args.alpha",
                "objective.args.judge"):
        assert f"  {key} (" in out, key
