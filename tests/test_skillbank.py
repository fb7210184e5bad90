"""SkillBank files, the four retrievers, the skills CLI, and skill extraction with a real model."""

from __future__ import annotations

import json
import random

import pytest
from agentkit.rollout.backend import chat_completer
from agentkit.rollout.collector import EpisodeSpec
from agentkit.skillbank import (
    Skill,
    SkillBank,
    SkillBankError,
    SkillSelector,
    make_retriever,
    resolve_bank,
    starter_banks,
)
from agentkit.skillbank.extract import extract_skills, jaccard, parse_skill

from agentkit.cli import main
from agentkit.core.errors import UnknownNameError
from agentkit.core.trajectory import Trajectory, Turn


def small_bank() -> SkillBank:
    return SkillBank([
        Skill(id="heat", title="Heat with microwave", text="heat the object with microwave", keywords=["heat", "hot"]),
        Skill(id="cool", title="Cool with fridge", text="cool the object with fridge", keywords=["cool", "cold"]),
        Skill(id="coin", title="Take the coin", text="take coin when you see it", keywords=["coin"],
              applies_to=["textworld/coin-v0"]),
        Skill(id="clean", title="Clean at the sink", text="clean it with sinkbasin", keywords=["clean"],
              applies_to=["alfworld:pick_clean_then_place"]),
    ])


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_bank_round_trip_keeps_stats(tmp_path, suffix):
    bank = small_bank()
    bank.record_episode(["heat", "cool"], 1.0)
    bank.record_episode(["heat"], 0.0)
    path = bank.save(tmp_path / f"bank{suffix}")
    again = SkillBank.load(path)
    assert [s.id for s in again] == ["heat", "cool", "coin", "clean"]
    assert again.episodes == 2
    assert (again.get("heat").stats.uses, again.get("heat").stats.mean_reward) == (2, 0.5)
    assert again.get("cool").stats.reward_sum == 1.0
    assert not list(tmp_path.glob("*.tmp"))  # atomic write leaves no temp file


def test_banks_written_with_return_sum_still_load(tmp_path):
    old = tmp_path / "old.yaml"  # as agentkit wrote the statistics before they were rewards
    old.write_text("episodes: 3\nskills:\n- {id: a, title: t, text: x, stats: {uses: 2, return_sum: 1.5}}\n")
    bank = SkillBank.load(old)
    assert (bank.get("a").stats.uses, bank.get("a").stats.mean_reward) == (2, 0.75)
    assert "reward_sum: 1.5" in bank.save(tmp_path / "new.yaml").read_text()
    old.write_text("skills:\n- {id: a, title: t, text: x, stats: {uses: 2, return_sum: 1.5, reward_sum: 1.5}}\n")
    with pytest.raises(SkillBankError, match="stats.return_sum: Extra inputs"):  # one of the two, never both
        SkillBank.load(old)


def test_starter_banks_load_and_cover_every_env_family():
    assert set(starter_banks()) == {"textworld", "alfworld", "scienceworld", "search_qa", "webshop", "vaults"}
    for name in starter_banks():
        bank = SkillBank.load(resolve_bank(name))
        assert len(bank) >= 4 and all(s.text and s.title for s in bank)
    alf = SkillBank.load(resolve_bank("alfworld"))
    heat = alf.for_env("alfworld/alfworld-v0", "pick_heat_then_place")
    assert "alf.heat" in [s.id for s in heat] and "alf.cool" not in [s.id for s in heat]


def test_bad_bank_files_name_the_file_and_skill(tmp_path):
    bad = tmp_path / "bank.yaml"
    bad.write_text("skills:\n- {id: a, title: t, text: x, keywords: [on]}\n")  # YAML reads `on` as True
    with pytest.raises(SkillBankError, match=r"bank.yaml, skill #1 \('a'\): keywords.0"):
        SkillBank.load(bad)
    bad.write_text("skills:\n- {id: a, title: t, text: x}\n- {id: a, title: u, text: y}\n")
    with pytest.raises(SkillBankError, match="id 'a' appears twice"):
        SkillBank.load(bad)
    bad.write_text("skills:\n- {id: a, title: t, txt: x}\n")
    with pytest.raises(SkillBankError, match="skill #1"):
        SkillBank.load(bad)
    bad.write_text("{not yaml")
    with pytest.raises(SkillBankError, match="Cannot read skill bank"):
        SkillBank.load(bad)
    with pytest.raises(SkillBankError, match="does not exist"):
        SkillBank.load(tmp_path / "missing.yaml")
    with pytest.raises(UnknownNameError, match="Did you mean 'heat'"):
        small_bank().get("haet")


def test_ucb_untried_first_then_mean_plus_bonus():
    bank = small_bank()
    ucb = make_retriever("ucb", {"c": 1.0})
    # all untried: any 2 of the applicable (heat, cool: coin and clean apply elsewhere), order by rng
    kw = {"env": "alfworld/alfworld-v0", "task_type": "pick_heat_then_place"}
    first = ucb.retrieve(bank, "", 2, rng=random.Random(0), **kw)
    assert {s.id for s in first} == {"heat", "cool"}
    bank.record_episode(["heat"], 1.0)
    # cool is untried -> first
    assert ucb.retrieve(bank, "", 1, **kw)[0].id == "cool"
    bank.record_episode(["cool"], 0.0)
    bank.record_episode(["cool"], 0.0)
    # heat: 1 + sqrt(ln 3 / 1) beats cool: 0 + sqrt(ln 3 / 2)
    assert ucb.score(bank.get("heat"), 3) == pytest.approx(1 + (1.0986 / 1) ** 0.5, rel=1e-3)
    assert [s.id for s in ucb.retrieve(bank, "", 2, **kw)] == ["heat", "cool"]
    # without a task type every alfworld task type's skill applies (clean is untried -> first)
    assert ucb.retrieve(bank, "", 1, env="alfworld/alfworld-v0")[0].id == "clean"


def test_keyword_full_random():
    bank = small_bank()
    kw = make_retriever("keyword")
    assert [s.id for s in kw.retrieve(bank, "Put a hot apple in the fridge to cool it", 2)] == ["cool", "heat"]
    assert kw.retrieve(bank, "zebra", 3) == []  # no overlap -> nothing
    assert [s.id for s in make_retriever("keyword", {"method": "overlap"}).retrieve(bank, "heat it", 1)] == ["heat"]
    full = make_retriever("full", {"max_chars": 110})
    assert [s.id for s in full.retrieve(bank, "", 99)] == ["heat", "cool"]  # budget stops it
    rnd = make_retriever("random")
    a = rnd.retrieve(bank, "", 2, rng=random.Random(7))
    assert a == rnd.retrieve(bank, "", 2, rng=random.Random(7)) and len(a) == 2
    with pytest.raises(UnknownNameError, match="Did you mean 'keyword'"):
        make_retriever("keywrod")


def test_selector_is_seeded_per_episode_and_renders_for_the_policy():
    bank = small_bank()
    sel = SkillSelector(bank, make_retriever("random"), 2, env_id="alfworld/alfworld-v0", seed=3, show_policy=True)
    ids, text = sel(EpisodeSpec(5, 1), "task", {})
    assert ids == sel(EpisodeSpec(5, 1), "task", {})[0]
    assert text.startswith("[Skills]") and all(bank.get(i).title in text for i in ids)
    hidden = SkillSelector(bank, make_retriever("random"), 2, env_id="alfworld/alfworld-v0", seed=3)
    assert hidden(EpisodeSpec(5, 1), "task", {}) == (ids, None)


def test_skills_cli_list_and_retrieve(tmp_path, capsys):
    assert main(["skills", "list", "textworld"]) == 0
    out = capsys.readouterr().out
    assert "tw.coin-explore" in out and "8 skills" in out
    assert main(["skills", "retrieve", "alfworld", "--task", "heat some egg and put it in the garbagecan",
                 "--strategy", "keyword", "-k", "2", "--env", "alfworld/alfworld-v0"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("alf.heat\t")
    assert main(["skills", "list", "alfwrld"]) == 2
    assert "Did you mean 'alfworld'" in capsys.readouterr().err


def won_episode(task: str, actions: list[str]) -> Trajectory:
    turns = [Turn(observation="o", context_ids=[1], response_ids=[2], response_logprobs=[-0.1], response_text=a,
                  action=a, action_valid=True, reward=0.0, feedback="f") for a in actions]
    return Trajectory(id=f"g|{task}|0", env="textworld/coin-v0", task=task, seed=0, split="train", group="g", sample=0,
                      turns=turns, episode_return=1.0, won=True, score=1.0, terminated=True, truncated=False,
                      model="m", sampling={})


def test_parse_and_dedup_helpers():
    assert parse_skill("TITLE: Go on\nSKILL: Walk\n  east first.") == ("Go on", "Walk east first.", True)
    assert parse_skill("just walk east") == ("just walk east", "just walk east", False)
    assert jaccard("take the coin now", "Take coin now!") == 1.0


def test_extract_with_a_real_model_dedups_on_the_second_pass(tiny_model_dir, backend, tmp_path):
    bank_path = tmp_path / "bank.yaml"
    small_bank().save(bank_path)
    episodes = [won_episode("Find the coin", ["go east", "take coin"]), won_episode("Find the key", ["go west"])]
    bank = SkillBank.load(bank_path)
    first = extract_skills(episodes, bank, chat_completer(backend, 12))
    assert first.episodes == 2
    assert len(first.added) + first.duplicates + first.empty == 2
    for skill_id in first.added:
        skill = bank.get(skill_id)
        assert skill.source.startswith("extracted:") and skill.applies_to == ["textworld/coin-v0"]
    second = extract_skills(episodes, bank, chat_completer(backend, 12))  # greedy: the same answers again
    assert second.added == [] and second.duplicates == len(first.added) + first.duplicates
    # the CLI adds to the file and keeps what was there
    from agentkit.core.jsonl import TrajectoryWriter

    traj_file = tmp_path / "t.jsonl"
    with TrajectoryWriter(traj_file, mode="overwrite") as w:
        for e in episodes:
            w.write(e)
    assert main(["skills", "extract", "--trajectories", str(traj_file), "--bank", str(bank_path),
                 "--teacher", f"model:{tiny_model_dir}", "--max-new-tokens", "12"]) == 0
    assert {"heat", "cool", "coin", "clean"} <= {s.id for s in SkillBank.load(bank_path)}
    assert json.dumps(SkillBank.load(bank_path).to_dict())  # still a valid bank


@pytest.mark.textworld
def test_rollout_with_skills_puts_them_in_the_policy_prompt(tiny_model_dir, tmp_path):
    pytest.importorskip("textworld")
    from agentkit.rollout.hf_backend import load_tokenizer

    from agentkit.core.jsonl import read_trajectories

    out = tmp_path / "r.jsonl"
    assert main(["rollout", "--env", "textworld/coin-v0", "--model", str(tiny_model_dir), "--episodes", "2",
                 "--max-turns", "1", "--max-new-tokens", "4", "--env-workers", "0", "--skills", "textworld",
                 "--retrieval", "keyword", "--skills-k", "2", "--out", str(out), "--quiet"]) == 0
    trajectories = read_trajectories(out)
    assert all(t.skills_in_prompt and 1 <= len(t.skills) <= 2 for t in trajectories)
    prompt = load_tokenizer(tiny_model_dir).decode(trajectories[0].turns[0].context_ids)
    bank = SkillBank.load(resolve_bank("textworld"))
    assert "[Skills]" in prompt and all(bank.get(i).title in prompt for i in trajectories[0].skills)
