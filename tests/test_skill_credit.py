"""What UCB retrieval credits a skill with: the episode's return when the policy sees the skills,
the teacher's lift signed by the outcome when only the teacher does (``agentkit.train.skill_credit``)."""

from __future__ import annotations

import random

import pytest
import torch
from agentkit.objectives import (
    Capabilities,
    StepScores,
    TeacherScores,
    build_batch,
    capabilities_of,
    make_objective,
)
from agentkit.rollout import EpisodeSpec
from agentkit.skillbank import Skill, SkillBank, SkillSelector, make_retriever

from agentkit.core.trajectory import Trajectory, Turn
from agentkit.train.skill_credit import NEUTRAL, group_outcomes, lift_credits, skill_credits, teacher_lift


def test_teacher_lift_is_the_mean_log_ratio_over_each_episodes_response_tokens():
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1], [1, 1, 1, 1]], dtype=torch.float32)  # [3, 4]
    old = torch.full((3, 4), -1.0)
    gap = torch.tensor([[9.0, 1.0, 3.0, 9.0], [9.0, 9.0, -2.0, 0.0], [1.0, 1.0, 1.0, -2.0]])  # 9: not a response token
    lifts = teacher_lift(old + gap, old, mask, torch.tensor([0, 0, 1]), episodes=3)  # window mode: 2 rows for episode 0
    assert lifts == pytest.approx([(1 + 3 - 2 + 0) / 4, (1 + 1 + 1 - 2) / 4, 0.0])  # episode 2 has no tokens


def test_outcomes_and_credits_by_hand():
    returns = [1.0, 0.0, 0.0, 0.0, 4.0, 0.0, 1.0, 3.0, 0.5, 0.5, 1.0]
    groups = ["a"] * 4 + ["b"] * 4 + ["c"] * 2 + ["d"]
    # a: mean 0.25, largest deviation 0.75; b: mean 2, largest deviation 2; c: equal returns; d: alone
    assert group_outcomes(returns, groups) == pytest.approx([1, -1 / 3, -1 / 3, -1 / 3, 1, -1, -0.5, 0.5, 0, 0, 0])
    lifts = [0.2, -0.1, 0.3, 0.0, -0.4, -0.01, 0.7, 0.05, 0.9, -0.9, 2.0]
    assert lift_credits(lifts, returns, groups) == pytest.approx([
        1.0,  # won, endorsed by the teacher
        2 / 3, 1 / 3,  # lost: disfavoured (good), endorsed (bad), by a third of the way (three losers, one winner)
        0.5,  # no lift: says nothing
        0.0, 1.0, 0.25, 0.75,  # the best episode disfavoured, the worst disfavoured, middling ones by half
        0.5, 0.5, 0.5])  # equal returns, or a group of one: nothing to tell won from lost


def _trajectory(group: str, sample: int, ret: float, skills: list[str]) -> Trajectory:
    turns = [Turn(observation="o", context_ids=[1, 2], response_ids=[3, 4, 5], response_logprobs=[-0.5, -1.0, -1.5],
                  response_text="x", action="a", action_valid=True, reward=ret if t == 0 else 0.0, feedback="f")
             for t in range(2)]
    return Trajectory(id=f"{group}-{sample}", env="e", task="t", seed=0, split="train", group=group, sample=sample,
                      turns=turns, episode_return=ret, won=ret > 0, score=ret, terminated=True, truncated=False,
                      model="m", sampling={}, skills=skills)


class LiftTeacher:
    """A teacher whose log-prob of every sampled token is the student's plus ``lifts[episode]``."""

    name, tokenizer, full_vocabulary = "lift", None, True

    def __init__(self, lifts: list[float]) -> None:
        self.lifts = lifts

    def score(self, batch, trajectories, *, topk=None) -> TeacherScores:
        lift = torch.tensor(self.lifts)[batch.episode_index][:, None] * batch.response_mask  # [B, L]
        return TeacherScores(logprobs=batch.old_logprobs + lift, top1=batch.old_logprobs + lift)

    def generation_backend(self):
        return None


def test_the_credit_follows_who_sees_the_skills():
    for name in ("sdar", "rlsd", "skill_sd", "opsd"):  # the student never sees the skills: the teacher does
        needs = capabilities_of(name)
        assert needs.uses_skills and needs.needs_teacher and not needs.policy_sees_skills, name
    assert capabilities_of("skill_grpo").policy_sees_skills
    trajectories = [_trajectory("g", 0, 1.0, ["x"]), _trajectory("g", 1, 0.0, ["x"]), _trajectory("h", 0, 0.0, ["y"])]
    batch = build_batch(trajectories)
    scores = StepScores(teacher=LiftTeacher([0.3, 0.2, -1.0]).score(batch, trajectories))
    assert skill_credits(capabilities_of("skill_grpo"), trajectories, None, batch) == [1.0, 0.0, 0.0]  # the returns
    assert skill_credits(capabilities_of("sdar"), trajectories, scores, batch) == pytest.approx([1.0, 0.0, NEUTRAL])
    nobody = Capabilities(uses_skills=True)  # skills that neither the policy nor a teacher sees
    assert skill_credits(nobody, trajectories, None, batch) == [NEUTRAL] * 3
    with pytest.raises(ValueError, match="no teacher scores"):
        skill_credits(capabilities_of("sdar"), trajectories, None, batch)


def test_the_loops_score_phase_records_each_episodes_credit(tmp_path):
    from agentkit.train import Run, score
    from agentkit.train.config import load_config
    from agentkit.train.distributed import SingleProcess

    trajectories = [_trajectory("g", 0, 1.0, ["x", "y"]), _trajectory("g", 1, 0.0, ["x"]),
                    _trajectory("g", 2, 0.0, ["y"]), _trajectory("h", 0, 1.0, ["x"])]
    recorded = {}
    for objective in ("sdar", "skill_grpo"):
        cfg = load_config(None, [f"objective.name={objective}", "log.signal_episodes=0", f"out={tmp_path}"])
        bank = SkillBank([Skill(id=i, title=i, text=i) for i in ("x", "y")])
        made = make_objective(objective)
        run = Run(cfg=cfg, run_dir=tmp_path, ranks=SingleProcess(), tokenizer=None, policy=None, model=None, sampler=None,
                  optimizer=None, backend=None, objective=made, needs=made.requirements(),
                  teacher=LiftTeacher([0.5, 0.5, -0.5, 0.5]), bank=bank)
        score(run, trajectories, step=0)
        recorded[objective] = {s.id: (s.stats.uses, s.stats.reward_sum) for s in bank}
    # sdar: outcomes +1, -1/2, -1/2 in g, 0 in h; lifts +, +, -, + -> credits 1, 1/4, 3/4, 1/2
    assert recorded["sdar"] == {"x": (3, pytest.approx(1 + 0.25 + 0.5)), "y": (2, pytest.approx(1 + 0.75))}
    assert recorded["skill_grpo"] == {"x": (3, 2.0), "y": (2, 1.0)}  # the returns


# -- the bandit: a teacher-only skill that matters is found; a return credit cannot find it ----------------------
SKILLS = ["s0", "s1", "s2", "s3", "s4", "s5"]
INFORMATIVE = "s3"  # with it the teacher endorses the student's actions in won episodes, disfavours them in lost ones
BIAS = {"s1": 2.0, "s4": -2.0}  # noise skills that make the teacher endorse (s1) or disfavour (s4) everything


def _play(credit: str, seed: int, steps: int = 120, tasks: int = 4, group: int = 4, k: int = 2) -> float:
    """UCB over a bank of six teacher-only skills for ``steps`` steps; each episode wins with
    probability 0.4 whatever its skills (the student never sees them). Returns the share of the
    last half's episodes that retrieved the informative skill (k/6 = 1/3 at random)."""
    world, tokens = random.Random(seed), torch.Generator().manual_seed(seed)
    bank = SkillBank([Skill(id=s, title=s, text=s) for s in SKILLS])
    retriever = make_retriever("ucb")
    with_informative = []
    for step in range(steps):
        selector = SkillSelector(bank, retriever, k, env_id="e", seed=seed * 1_000_003 + step)
        chosen = [selector(EpisodeSpec(step * tasks + task, sample), "task", {})[0]
                  for task in range(tasks) for sample in range(group)]
        returns = [1.0 if world.random() < 0.4 else 0.0 for _ in chosen]
        if credit == "return":
            credits = returns
        else:
            lifts = [sum(BIAS.get(s, 0.0) + world.gauss(0, 1) for s in ids)
                     + (1.5 * (1 if won else -1) if INFORMATIVE in ids else 0.0)
                     for ids, won in zip(chosen, returns, strict=True)]
            shape = (len(chosen), 12)  # one row of 12 positions per episode
            mask = (torch.rand(shape, generator=tokens) < 0.7).float()  # [E, 12]
            old = -3 * torch.rand(shape, generator=tokens)  # [E, 12]
            teacher = old + torch.tensor(lifts)[:, None] + 0.3 * torch.randn(shape, generator=tokens)  # [E, 12]
            measured = teacher_lift(teacher, old, mask, torch.arange(len(chosen)), len(chosen))
            credits = lift_credits(measured, returns, [str(i // group) for i in range(len(chosen))])
        for ids, value in zip(chosen, credits, strict=True):  # in the episodes' order, as the loop does
            bank.record_episode(ids, value)
        if step >= steps // 2:
            with_informative += [INFORMATIVE in ids for ids in chosen]
    return sum(with_informative) / len(with_informative)


def test_ucb_concentrates_on_the_informative_teacher_only_skill():
    lift = [_play("lift", seed) for seed in range(8)]
    returns = [_play("return", seed) for seed in range(8)]  # the same worlds, credited with the return
    assert min(lift) > 0.75, lift  # 0.83 to 0.95 over seeds 0-39
    # the return, which no teacher-only skill can change, says nothing: about chance (1/3) on average
    assert sum(returns) / len(returns) < 0.45, returns
    assert all(r < f for r, f in zip(returns, lift, strict=True)), (returns, lift)
