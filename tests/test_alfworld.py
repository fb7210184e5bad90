"""The ALFWorld adapter on real generated games: contract, expert wins, seeds, splits, official data."""

from __future__ import annotations

import functools
import json
import multiprocessing
import shutil
from pathlib import Path

import pytest

pytest.importorskip("alfworld", reason="needs the alfworld extra")

from agentkit.envs import check_env  # noqa: E402
from agentkit.envs.alfworld.env import AlfWorldEnv  # noqa: E402
from agentkit.envs.alfworld.gen import (  # noqa: E402
    HELD_OUT_FLOOR_PLANS,
    TASK_TYPES,
    floor_plans,
    game_folder,
    generate_game,
    load_floor_plans,
    sample_game,
)

from agentkit.core.errors import ConfigError, EnvError  # noqa: E402

FIRST_LOOK = "You are in the middle of a room. Looking quickly around you, you see "


@pytest.fixture
def no_official_data(monkeypatch, tmp_path):
    """ALFWORLD_DATA pointing at an empty folder, so source='auto' means generated games."""
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "no-data"))


def play(env: AlfWorldEnv, actions: list[str]) -> tuple[float, bool, dict]:
    total, terminated, info = 0.0, False, {}
    for action in actions:
        _, reward, terminated, truncated, info = env.step(action)
        assert info["action_valid"], action
        assert not truncated
        total += reward
    return total, terminated, info


def test_check_env(no_official_data):
    env = AlfWorldEnv()
    try:
        assert env.source == "generated"
        check_env(env, seed=0)
    finally:
        env.close()


@pytest.mark.parametrize("task_type", list(TASK_TYPES))
def test_expert_plan_wins_every_task_type(task_type, no_official_data):
    env = AlfWorldEnv(task_types=[task_type])
    try:
        obs, info = env.reset(seed=0)
        assert obs.startswith(FIRST_LOOK), obs
        assert "Welcome to TextWorld" not in obs
        assert obs.endswith("Your task is to: " + info["task"])
        assert info["task"].endswith(".") and info["task_type"] == task_type
        assert info["privileged"].startswith("Expert plan from here: ")
        assert not info["won"] and info["score"] == 0.0
        traj_data = json.loads(Path(info["game_file"]).with_name("traj_data.json").read_text())
        assert traj_data["task_type"] == TASK_TYPES[task_type]
        total, terminated, info = play(env, info["expert_plan"])
        assert terminated and info["won"] and total == 1.0 and info["score"] == 1.0
        assert info["expert_plan"] == [] and info["privileged"] is None
        with pytest.raises(EnvError, match="after the episode ended"):
            env.step("look")
    finally:
        env.close()


def test_leaving_the_plan_replans_and_still_wins(no_official_data):
    env = AlfWorldEnv(task_types="pick_heat_then_place")
    try:
        _, info = env.reset(seed=0)
        plan = info["expert_plan"]
        detour = next(a for a in info["admissible_actions"] if a.startswith("go to ") and a != plan[0])
        _, reward, _, _, info = env.step(detour)
        assert info["action_valid"] and reward == 0.0
        replanned = info["expert_plan"]
        _, _, _, _, info = env.step("look")
        assert info["expert_plan"] == replanned, "looking around keeps the plan"
        total, terminated, info = play(env, replanned)
        assert terminated and info["won"] and total == 1.0
    finally:
        env.close()


def test_without_the_planner_the_stored_walkthrough_wins(no_official_data):
    env = AlfWorldEnv(task_types="pick_and_place", expert_plan=False)
    try:
        _, info = env.reset(seed=0)
        assert "expert_plan" not in info and info["privileged"] is None
        walkthrough = json.loads(Path(info["game_file"]).read_text())["walkthrough"]
        total, terminated, info = play(env, walkthrough)
        assert terminated and info["won"] and total == 1.0
    finally:
        env.close()


def test_invalid_commands_are_flagged(no_official_data):
    env = AlfWorldEnv(task_types="pick_and_place")
    try:
        _, first = env.reset(seed=0)
        for bad in ("xyzzy", "", "go to the moon", "take apple 99 from fridge 1", "\u00e9\u00e8 \x00", "go to" * 100):
            obs, reward, terminated, _, info = env.step(bad)
            assert obs == "Nothing happens."
            assert info["action_valid"] is False and reward == 0.0 and not terminated
            assert info["expert_plan"] == first["expert_plan"], "an invalid action keeps the plan"
        # case and spacing are forgiven: the game's commands are lower case
        _, _, _, _, info = env.step("  " + first["expert_plan"][0].upper().replace(" ", "  "))
        assert info["action_valid"]
    finally:
        env.close()


def test_same_seed_same_game_other_seeds_differ(no_official_data, tmp_path):
    env = AlfWorldEnv(task_types="pick_and_place")
    other = AlfWorldEnv(task_types="pick_and_place", cache=tmp_path)  # generates again, elsewhere
    try:
        a, info_a = env.reset(seed=0)
        b, info_b = other.reset(seed=0)
        assert a == b and info_a["expert_plan"] == info_b["expert_plan"]
        assert Path(info_a["game_file"]).read_bytes() == Path(info_b["game_file"]).read_bytes()
        c, _ = env.reset(seed=1)
        assert c != a
        assert env.reset(seed=0)[0] == a
    finally:
        env.close()
        other.close()


def test_seeds_cycle_through_the_chosen_task_types(no_official_data):
    both = AlfWorldEnv(task_types="pick_and_place, pick_heat_then_place")
    heat = AlfWorldEnv(task_types=["pick_heat_then_place_in_recep"])  # ALFWorld's long name
    try:
        assert both.task_types == ["pick_and_place", "pick_heat_then_place"]
        obs, info = both.reset(seed=1)
        assert info["task_type"] == "pick_heat_then_place"
        assert heat.reset(seed=0)[0] == obs, "game 0 of a task type whatever the other types"
    finally:
        both.close()
        heat.close()


def test_train_and_eval_in_are_different_games(no_official_data):
    train = AlfWorldEnv(split="train", task_types="pick_and_place")
    evals = AlfWorldEnv(split="eval", task_types="pick_and_place")
    try:
        assert evals.split == "eval_in"
        a, info_a = train.reset(seed=0)
        b, info_b = evals.reset(seed=0)
        assert a != b
        seeds = [json.loads(Path(i["game_file"]).with_name("traj_data.json").read_text())["agentkit"]["seed"]
                 for i in (info_a, info_b)]
        assert seeds[0] != seeds[1]
    finally:
        train.close()
        evals.close()


@pytest.mark.parametrize("task_type", list(TASK_TYPES))
def test_eval_out_floor_plans_are_held_out(task_type):
    train, eval_in, eval_out = (floor_plans(split, task_type) for split in ("train", "eval_in", "eval_out"))
    assert train and eval_out, "every task type has games in every split"
    assert train == eval_in == floor_plans("eval", task_type)
    assert set(eval_out) <= set(HELD_OUT_FLOOR_PLANS)
    assert not set(eval_out) & set(train)
    assert set(train) | set(HELD_OUT_FLOOR_PLANS) <= set(load_floor_plans())
    # sample_game draws from those lists (no planner: cheap)
    for index in range(3):
        assert sample_game("eval_out", task_type, index).spec.floor_plan in eval_out
        assert sample_game("train", task_type, index).spec.floor_plan in train


def test_an_unsolved_game_is_drawn_again_with_the_next_attempt(tmp_path):
    from agentkit.envs.alfworld.env import _Engine

    engine = _Engine()
    attempts = []

    def solve_from_second_attempt(game):
        attempts.append(game["pddl_problem"])
        return engine.solve(game) if len(attempts) > 1 else []

    try:
        game_file = generate_game("train", "pick_and_place", 0, solve_from_second_attempt, root=tmp_path)
    finally:
        engine.close()
    assert len(attempts) == 2 and attempts[0] != attempts[1]
    assert json.loads(game_file.with_name("traj_data.json").read_text())["agentkit"]["attempt"] == 1
    assert json.loads(game_file.read_text())["pddl_problem"] == attempts[1]
    with pytest.raises(EnvError, match="No solvable ALFWorld game .* after 20 attempts"):
        generate_game("train", "pick_and_place", 1, lambda game: [], root=tmp_path)
    assert not game_folder("train", "pick_and_place", 1, root=tmp_path).exists()


def test_bad_arguments_are_clear(no_official_data, monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match=r"Unknown ALFWorld split 'eval_inn'\. Did you mean 'eval_in'"):
        AlfWorldEnv(split="eval_inn")
    with pytest.raises(ConfigError, match=r"Unknown ALFWorld task type 'pick_heat_and_place'\. Did you mean 'pick_heat_then_place'"):
        AlfWorldEnv(task_types="pick_and_place,pick_heat_and_place")
    with pytest.raises(ConfigError, match="task_types is empty"):
        AlfWorldEnv(task_types=[])
    with pytest.raises(ConfigError, match="task_types must be None"):
        AlfWorldEnv(task_types=3)
    with pytest.raises(ConfigError, match="expert_plan must be True or False"):
        AlfWorldEnv(expert_plan="no")
    with pytest.raises(ConfigError, match=r"source must be one of.*Did you mean 'official'"):
        AlfWorldEnv(source="oficial")
    with pytest.raises(ConfigError, match="source='official' needs ALFWORLD_DATA"):
        AlfWorldEnv(source="official")
    monkeypatch.delenv("ALFWORLD_DATA")
    with pytest.raises(ConfigError, match="ALFWORLD_DATA is None"):
        AlfWorldEnv(source="official")
    env = AlfWorldEnv(source="generated")
    try:
        with pytest.raises(EnvError, match="before reset"):
            env.step("look")
        with pytest.raises(ConfigError, match="seeds are integers from 0"):
            env.reset(seed=-1)
        with pytest.raises(ConfigError, match="got 1.5"):
            env.reset(seed=1.5)
    finally:
        env.close()


def _official_layout(root: Path, games: list[Path], split_folder: str = "valid_seen") -> list[Path]:
    """ALFWorld's data layout: json_2.1.1/<split>/<task folder>/<trial>/{game.tw-pddl, traj_data.json}."""
    placed = []
    for game_file in games:
        traj_data = json.loads(game_file.with_name("traj_data.json").read_text())
        params = traj_data["pddl_params"]
        task = "-".join([traj_data["task_type"], params["object_target"], "None", params["parent_target"] or "None",
                         str(traj_data["scene"]["scene_num"])])
        trial = root / "json_2.1.1" / split_folder / task / "trial_T20190000_000000_000000"
        trial.mkdir(parents=True)
        shutil.copy(game_file, trial / "game.tw-pddl")
        shutil.copy(game_file.with_name("traj_data.json"), trial / "traj_data.json")
        placed.append(trial / "game.tw-pddl")
    return placed


def test_official_source_plays_official_game_files(no_official_data, monkeypatch, tmp_path):
    generated = AlfWorldEnv(task_types="pick_and_place,pick_clean_then_place")
    try:
        first = {seed: generated.reset(seed=seed) for seed in (0, 1)}
    finally:
        generated.close()
    games = [Path(info["game_file"]) for _, info in first.values()]
    placed = _official_layout(tmp_path / "data", games)
    # what ALFWorld skips: movable-receptacle tasks and games not marked solvable
    _official_layout(tmp_path / "data", games[:1], "valid_seen/movable")
    unsolvable = placed[0].parent.with_name("trial_T20190000_000000_000001") / "game.tw-pddl"
    unsolvable.parent.mkdir()
    unsolvable.write_text(json.dumps({**json.loads(games[0].read_text()), "solvable": False}))
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "data"))

    env = AlfWorldEnv(split="eval_in")  # source="auto" finds the official games
    expected = {str(path): obs_info for path, obs_info in zip(placed, first.values(), strict=True)}
    try:
        assert env.source == "official"
        played = []
        for seed in (0, 1, 2):
            obs, info = env.reset(seed=seed)
            played.append(info["game_file"])
            expected_obs, expected_info = expected[info["game_file"]]
            assert obs == expected_obs and info["task_type"] == expected_info["task_type"]
            if seed < 2:
                total, terminated, end = play(env, info["expert_plan"])
                assert terminated and end["won"] and total == 1.0
        assert played[2] == played[0] != played[1], "seeds wrap around the two games; the others are skipped"
    finally:
        env.close()
    only_clean = AlfWorldEnv(split="eval_in", source="official", task_types="pick_clean_then_place")
    try:
        assert only_clean.reset(seed=0)[1]["task_type"] == "pick_clean_then_place"
    finally:
        only_clean.close()


def test_empty_official_game_list_is_an_error(monkeypatch, tmp_path):
    (tmp_path / "json_2.1.1" / "train").mkdir(parents=True)
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    env = AlfWorldEnv(source="auto")
    try:
        assert env.source == "generated", "auto falls back to generated games when there are none"
    finally:
        env.close()
    env = AlfWorldEnv(source="official")
    try:
        with pytest.raises(EnvError, match=r"No ALFWorld games found under .*json_2\.1\.1/train"):
            env.reset(seed=0)
    finally:
        env.close()


def _play_in_child(make_env) -> tuple[str, bool, str]:
    env = make_env()
    try:
        obs, info = env.reset(seed=0)
        game_file = info["game_file"]
        for action in info["expert_plan"]:
            _, _, _, _, info = env.step(action)
        return obs, info["won"], game_file
    finally:
        env.close()


def test_builds_in_a_spawned_process_from_keyword_arguments(no_official_data, tmp_path):
    # the child (a fresh interpreter, its own hash seed) generates into its own cache: same bytes
    make_env = functools.partial(AlfWorldEnv, split="train", task_types="pick_and_place", source="generated",
                                 cache=str(tmp_path))
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        obs, won, game_file = pool.apply(_play_in_child, (make_env,))
    assert won and Path(game_file).is_relative_to(tmp_path)
    env = AlfWorldEnv(task_types="pick_and_place")
    try:
        here, info = env.reset(seed=0)
        assert here == obs
        assert Path(info["game_file"]).read_bytes() == Path(game_file).read_bytes()
    finally:
        env.close()
    assert Path(info["game_file"]).parent == game_folder("train", "pick_and_place", 0)


def test_official_split_names_are_aliases(no_official_data, monkeypatch, tmp_path, capsys):
    """valid_seen / valid_unseen name our eval_in / eval_out; valid_train exists only in the official data."""
    for official, ours in (("valid_seen", "eval_in"), ("valid_unseen", "eval_out"), ("eval", "eval_in")):
        env = AlfWorldEnv(split=official, task_types="pick_and_place", cache=str(tmp_path / "games"))
        try:
            assert env.split == ours and env.source == "generated"
        finally:
            env.close()
    with pytest.raises(ConfigError, match=r"'valid_train' exists only in the official data .*ALFWORLD_DATA"):
        AlfWorldEnv(split="valid_train")
    with pytest.raises(ConfigError, match=r"Unknown ALFWorld split 'valid_sen'\. Did you mean 'valid_seen'"):
        AlfWorldEnv(split="valid_sen")

    # official data with a valid_train folder: played under that name; valid_seen finds the valid_seen folder
    generated = AlfWorldEnv(task_types="pick_and_place", cache=str(tmp_path / "games"))
    try:
        generated.reset(seed=0)
        game = Path(generated.reset(seed=1)[1]["game_file"])
    finally:
        generated.close()
    _official_layout(tmp_path / "data", [game], "valid_train")
    _official_layout(tmp_path / "data", [game], "valid_seen")
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "data"))
    capsys.readouterr()
    for split, folder in (("valid_train", "valid_train"), ("valid_seen", "valid_seen")):
        env = AlfWorldEnv(split=split)
        try:
            assert env.source == "official"
            assert f"/json_2.1.1/{folder}/" in env.reset(seed=0)[1]["game_file"]
        finally:
            env.close()
        assert capsys.readouterr().err == (f"ALFWorld: playing the official games at "
                                           f"{tmp_path / 'data' / 'json_2.1.1' / folder} (split {env.split})\n")


def test_the_source_is_said_once_and_generation_shows_progress(no_official_data, tmp_path, capsys):
    cache = tmp_path / "games"
    envs = [AlfWorldEnv(split="eval_out", task_types="pick_and_place,look_at_obj_in_light", cache=str(cache))
            for _ in range(2)]
    try:
        lines = capsys.readouterr().err.splitlines()
        assert lines == [f"ALFWorld: playing generated games (split eval_out, cached under {cache / 'gen-v1' / 'eval_out'}); "
                         "set ALFWORLD_DATA to the official data to play those"], lines
        envs[0].prepare([0, 1, 2, 0])
        lines = capsys.readouterr().err.splitlines()
        assert lines[0].startswith("generating 3 ALFWorld games for split eval_out on first use") and str(cache) in lines[0]
        assert len(lines) == 1, lines  # no bar when stderr is no terminal
        envs[1].prepare([2, 1])  # generated already
        envs[1].reset(seed=1)
        assert capsys.readouterr().err == ""
        made = sorted(p.relative_to(cache / "gen-v1" / "eval_out").parent.as_posix() for p in cache.rglob("game.tw-pddl"))
        assert made == ["look_at_obj_in_light/0", "pick_and_place/0", "pick_and_place/1"]
    finally:
        for env in envs:
            env.close()
