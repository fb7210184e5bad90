"""vaults/vaults-v0: the built-in toy environment with family rules (envs/vaults_env.py)."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from agentkit.envs import ActionParser, check_env, make, play_expert
from agentkit.envs.vaults_env import (
    META_FAMILIES,
    PHRASINGS,
    RULES,
    TARGET_FAMILIES,
    VaultsEnv,
    parse_move,
    rule_text,
)

from agentkit.core.errors import ConfigError

ENV = "vaults/vaults-v0"


def test_check_env_passes_and_the_cli_check_plays_the_expert():
    env = make(ENV)
    check_env(env, seed=0)
    check_env(make(ENV, split="test", families="target"), seed=7)
    result = subprocess.run([sys.executable, "-m", "agentkit.cli", "envs", "check", ENV, "--tasks", "3"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "expert won 3/3 tasks" in result.stdout


@pytest.mark.parametrize("split", ["train", "dev", "test", "eval"])
@pytest.mark.parametrize("families", ["meta", "target"])
def test_the_expert_wins_every_task_in_the_fewest_moves(split, families):
    env = make(ENV, split=split, families=families)
    for seed in range(24):
        assert play_expert(env, seed) == (True, 3)


def test_the_expert_plan_through_the_action_parser_wins():
    env = make(ENV, max_turns=6, action_parser=ActionParser())
    _, info = env.reset(seed=3)
    total = 0.0
    for action in info["expert_plan"]:
        _, reward, terminated, _, info = env.step(f"<action>{action}</action>")
        total += reward
    assert terminated and info["won"] and total == pytest.approx(1.0)


def test_splits_are_disjoint_seed_ranges_and_eval_is_dev():
    layouts = {split: [VaultsEnv(split=split).task(seed) for seed in range(300)] for split in ("train", "dev", "test")}
    assert not set(layouts["train"]) & set(layouts["dev"])
    assert not set(layouts["train"]) & set(layouts["test"])
    assert not set(layouts["dev"]) & set(layouts["test"])
    assert [VaultsEnv(split="eval").task(seed) for seed in range(300)] == layouts["dev"]
    with pytest.raises(ConfigError, match=r"split must be one of \['train', 'dev', 'test', 'eval'\], got 'valid'"):
        VaultsEnv(split="valid")
    with pytest.raises(ConfigError, match="seeds for split 'train' run from 0 to 999999"):
        VaultsEnv().reset(seed=-1)


def test_same_seed_same_episode_and_families_cycle_with_the_seed():
    def play(seed: int) -> list[tuple]:
        env = VaultsEnv(families="all")
        obs, info = env.reset(seed=seed)
        trace = [(obs, info["task"])]
        rng = random.Random(seed)
        done = False
        while not done:
            obs, reward, terminated, truncated, info = env.step(rng.choice(info["admissible_actions"]))
            trace.append((obs, reward, info["won"]))
            done = terminated or truncated
        return trace

    assert play(5) == play(5)
    assert play(5) != play(6)
    families = [VaultsEnv(families="all").task(seed).family for seed in range(len(RULES))]
    assert families == [*META_FAMILIES, *TARGET_FAMILIES]
    assert {VaultsEnv(families="target").task(seed).family for seed in range(40)} == set(TARGET_FAMILIES)
    assert VaultsEnv(families=["kelp"]).task(9).family == "kelp"
    with pytest.raises(ConfigError, match=r"unknown vault families \['granit'\]"):
        VaultsEnv(families="granit")


def test_the_family_is_in_every_observation_and_the_rule_only_in_privileged():
    env = VaultsEnv()
    for seed in range(len(RULES)):
        obs, info = env.reset(seed=seed)
        family = info["task_type"]
        marker = RULES[family]
        assert family in obs and family in info["task"]
        assert rule_text(family) in info["privileged"]
        assert "marked " + marker not in obs and "marked " + marker not in info["task"]
        for action in info["expert_plan"]:
            obs, _, _, _, step_info = env.step(action)
            assert family in obs
            assert "marked " + marker not in obs


@pytest.mark.parametrize("template", PHRASINGS)
def test_every_phrasing_of_an_exit_is_the_same_valid_action(template):
    env = VaultsEnv()
    _, info = env.reset(seed=4)
    marker = RULES[info["task_type"]]
    obs, reward, _, _, info = env.step(template.format(m=marker))
    assert info["action_valid"] and reward == pytest.approx(1 / 3)
    assert "chamber 2 of 3" in obs
    assert parse_move(template.format(m=marker).upper() + ".") == marker


def test_a_wrong_exit_is_recoverable_at_the_cost_of_two_moves():
    env = VaultsEnv()
    obs, info = env.reset(seed=2)
    marker = RULES[info["task_type"]]
    wrong = next(a for a in info["admissible_actions"] if a != f"go {marker}")
    obs, reward, terminated, _, info = env.step(wrong)
    assert "dead end" in obs and reward == 0.0 and not terminated and info["action_valid"]
    assert info["admissible_actions"] == ["go back"] and info["expert_plan"][0] == "go back"
    _, _, _, _, info = env.step(f"go {marker}")  # not a way out of a dead end
    assert not info["action_valid"]
    obs, _, _, _, info = env.step("return")
    assert info["action_valid"] and "chamber 1 of 3" in obs and "Moves left: 3" in obs
    for action in info["expert_plan"]:
        _, _, terminated, _, info = env.step(action)
    assert terminated and info["won"]  # 6 moves: a wrong exit, an invalid move, back, then 3 right exits


def test_running_out_of_moves_ends_the_episode_lost():
    env = VaultsEnv(moves=4)
    _, info = env.reset(seed=0)
    wrong = next(a for a in info["admissible_actions"] if a != info["expert_plan"][0])
    for action in (wrong, "go back", info["expert_plan"][0]):
        _, _, terminated, _, info = env.step(action)
        assert not terminated
    obs, _, terminated, truncated, info = env.step("dance")
    assert terminated and not truncated and not info["won"] and "You lose" in obs
    assert info["admissible_actions"] == [] and info["expert_plan"] == []


def test_sparse_rewards_pay_only_the_win():
    env = VaultsEnv(rewards="sparse")
    _, info = env.reset(seed=1)
    rewards = [env.step(action)[1] for action in info["expert_plan"]]
    assert rewards == [0.0, 0.0, 1.0]


def test_chance_success_is_low_but_not_zero():
    """A policy choosing uniformly among the admissible actions: about 5% with the defaults."""
    rng = random.Random(0)
    for families in ("meta", "target"):
        env = VaultsEnv(families=families)
        wins = 0
        for seed in range(2000):
            _, info = env.reset(seed=seed)
            done = False
            while not done:
                _, _, terminated, truncated, info = env.step(rng.choice(info["admissible_actions"]))
                done = terminated or truncated
            wins += info["won"]
        assert 0.02 < wins / 2000 < 0.10, (families, wins)


def test_the_starter_bank_states_each_family_rule_for_that_family_only():
    from agentkit.skillbank import SkillBank, default_bank_for, resolve_bank
    from agentkit.skillbank.retrieval import make_retriever

    assert default_bank_for(ENV) == "vaults"
    bank = SkillBank.load(resolve_bank("vaults"))
    for family in RULES:
        assert bank.get(f"vaults.{family}").text == rule_text(family)
        rules = [s for s in bank.for_env(ENV, family) if s.id.removeprefix("vaults.") in RULES]
        assert [s.id for s in rules] == [f"vaults.{family}"]
    env = VaultsEnv(families="target")
    _, info = env.reset(seed=1)
    for name in ("ucb", "keyword", "full", "random"):  # the defaults (ucb, k=3) and the rest
        chosen = make_retriever(name).retrieve(bank, info["task"], 3, env=ENV, task_type=info["task_type"],
                                               rng=random.Random(0))
        assert f"vaults.{info['task_type']}" in [s.id for s in chosen], name


def test_practice_families_draw_their_rules_over_every_marker_and_need_their_skill():
    from agentkit.envs.vaults_env import FAMILY_RULES, PRACTICE_FAMILIES, PRACTICE_RULES

    assert len(PRACTICE_FAMILIES) == 240 and not set(PRACTICE_FAMILIES) & set(RULES)
    assert set(PRACTICE_RULES.values()) == set(RULES.values())  # every marker is right in some practice family
    assert FAMILY_RULES == {**RULES, **PRACTICE_RULES}
    env = make(ENV, families="practice")
    seen = set()
    for seed in range(30):
        assert play_expert(env, seed) == (True, 3)
        vault = VaultsEnv(families="practice").task(seed)
        seen.add(vault.family)
        assert vault.marker == PRACTICE_RULES[vault.family] and all(vault.marker in row for row in vault.chambers)
        assert rule_text(vault.family) == f"In {vault.family} vaults take the exit marked {vault.marker}."
    assert len(seen) == 30 and VaultsEnv(families="named").families == VaultsEnv(families="all").families


def test_demonstrations_record_the_task_type_as_the_collector_does(tiny_model_dir):
    from agentkit.rollout.demos import play_demonstration
    from agentkit.rollout.hf_backend import load_tokenizer

    env = make(ENV, split="dev", families="target", action_parser="format")
    demo = play_demonstration(env, load_tokenizer(tiny_model_dir), env_id=ENV, seed=2, split="dev")
    assert demo.won and demo.task_type == VaultsEnv(split="dev", families="target").task(2).family


def test_sealed_exits_cost_one_move_and_keep_the_chamber():
    env = VaultsEnv(families="target", dead_ends=False)
    obs, info = env.reset(seed=4)
    assert "a wrong exit is sealed" in obs
    right = info["expert_plan"][0]
    wrong = next(a for a in info["admissible_actions"] if a != right)
    for moves_left in (5, 4, 3):  # three wrong tries can be afforded
        obs, reward, terminated, _, info = env.step(wrong)
        assert f"The {wrong[3:]} exit is sealed; you stay in the chamber." in obs and "chamber 1 of 3" in obs
        assert (reward, terminated, info["action_valid"], f"Moves left: {moves_left}" in obs) == (0.0, False, True, True)
        assert info["admissible_actions"] == VaultsEnv(families="target", dead_ends=False).reset(seed=4)[1][
            "admissible_actions"] and "go back" not in info["expert_plan"]
    for _ in range(3):
        obs, reward, terminated, _, info = env.step(right)
    assert terminated and info["won"]
    _, info = env.reset(seed=4)
    for _ in range(4):
        _, _, terminated, _, info = env.step(wrong)
    assert not terminated and info["expert_plan"] == [right] * 3
    _, _, terminated, _, info = env.step(right)
    _, _, terminated, _, info = env.step(right)
    assert terminated and not info["won"]  # 4 wrong + 2 right = 6 moves: the lamp is out before the last chamber
    with pytest.raises(ConfigError, match="dead_ends must be true or false"):
        VaultsEnv(dead_ends="no")


def test_the_env_reports_each_action_as_it_read_it_and_a_parse_failure_reads_nothing():
    env = make(ENV, action_parser="format")
    _, info = env.reset(seed=4)
    marker = RULES[info["task_type"]]
    _, _, _, _, info = env.step(f"<action>take the {marker} exit</action>")
    assert info["action"] == f"take the {marker} exit" and info["action_read"] == f"go {marker}"
    _, _, _, _, info = env.step("no tag at all")  # the wrapper answers; the last step's reading must not leak
    assert info["action"] is None and info["action_read"] is None and not info["action_valid"]
    _, _, _, _, info = env.step("<action>dance</action>")
    assert info["action_valid"] is False and info["action_read"] is None


def _turn(env, text: str, before: dict):
    from agentkit.core.trajectory import Turn

    _, reward, _, _, info = env.step(f"<action>{text}</action>")
    plan = before["expert_plan"]
    turn = Turn(observation="", context_ids=[1], response_ids=[2], response_logprobs=[0.0], response_text=text,
                action=info["action"], action_valid=info["action_valid"], reward=reward, feedback="",
                expert_action=plan[0] if plan else None, action_read=info.get("action_read"))
    return turn, info


def test_the_oracle_judge_skips_the_experts_action_in_other_words_and_counts_those_turns():
    """SAGE-OPD's "semantically valid alternative": the student says the expert's action its own way."""
    from agentkit.teachers import OracleJudge

    from agentkit.core.trajectory import Trajectory

    env = make(ENV, action_parser="format")
    _, info = env.reset(seed=4)
    marker = RULES[info["task_type"]]
    turns = []
    for text in (f"take the {marker} exit", f"go {marker}", "enter {wrong}", "fly", "back"):
        wrong = next(a for a in info["admissible_actions"] if a != f"go {marker}").split()[1]
        turn, info = _turn(env, text.format(wrong=wrong), info)
        turns.append(turn)
    reads = [t.action_read for t in turns]
    assert reads[:2] == [f"go {marker}"] * 2 and reads[3:] == [None, "go back"]
    assert reads[2] == "go " + turns[2].action.split()[1] != f"go {marker}" and turns[2].action_valid
    episode = Trajectory(id="v|train|4|0", env=ENV, task="", seed=4, split="train", group="v|train|4", sample=0,
                         turns=turns, episode_return=0.0, won=False, score=0.0, terminated=False, truncated=False,
                         model="", sampling={})
    judged = OracleJudge().judge([episode])
    assert judged.labels == [["skip", "skip", "weak", "strong", "skip"]]
    assert judged.alternatives == [[True, False, False, False, True]]  # "back" is "go back" in other words
    metrics = judged.metrics()
    assert metrics["judge_alternative_share"] == pytest.approx(2 / 5)
    assert metrics["judge_alternative_skip_share"] == 1.0
    assert Trajectory.from_dict(episode.to_dict()).turns[0].action_read == f"go {marker}"


def test_the_collector_records_what_the_env_read(vaults_sft_model):
    from agentkit.rollout import Collector, EpisodeSpec, SamplingParams
    from agentkit.rollout.hf_backend import HFBackend
    from agentkit.rollout.run import env_factory

    out = []
    collector = Collector(HFBackend(vaults_sft_model), env_factory(ENV, split="train", max_turns=4,
                                                                  env_kwargs={"families": "amber"}),
                          env_id=ENV, sampling=SamplingParams(max_new_tokens=12, temperature=1.0, seed=3))
    collector.run([EpisodeSpec(seed, sample) for seed in range(4) for sample in range(2)], out.append)
    turns = [turn for t in out for turn in t.turns]
    assert any(turn.action_read for turn in turns)
    for turn in turns:
        move = parse_move(turn.action) if turn.action else None
        expected = None if move is None else "go back" if move == "back" else f"go {move}"
        assert turn.action_read == expected, turn
