"""textarena/<game>: TextArena's single-player games through the adapter (envs/textarena_env.py)."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
import warnings
from collections import deque

import pytest

pytest.importorskip("textarena", reason="needs the textarena extra: pip install 'agentkit[textarena]'")

import textarena as ta  # noqa: E402
from agentkit.envs import BRACKET_ACTION_TAG, check_env, env_info, make, play_expert  # noqa: E402
from agentkit.envs.textarena_env import SEEDS_PER_SPLIT, TextArenaEnv, hanoi_moves  # noqa: E402

from agentkit.core.errors import ConfigError, EnvError, MissingDependencyError  # noqa: E402
from agentkit.core.jsonl import read_trajectories  # noqa: E402

GUESS, HANOI = "textarena/GuessTheNumber-v0", "textarena/TowerOfHanoi-v0"
IDS = (GUESS, HANOI)


def run_cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentkit.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def play(env, seed: int, actions: list[str]) -> list[tuple]:
    obs, info = env.reset(seed=seed)
    trace = [(obs, info["task"], info["privileged"])]
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        trace.append((obs, reward, terminated, info["action_valid"], info["privileged"]))
        if terminated or truncated:
            break
    return trace


# -- registration ------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", IDS)
def test_registered_with_the_extra_the_bracket_format_and_room_for_the_expert(env_id):
    info = env_info(env_id)
    assert info.extra == "textarena" and info.requires == ("textarena",) and info.description
    assert info.action_format is BRACKET_ACTION_TAG
    assert info.splits == (("train", "eval") if env_id == GUESS else ("train",))
    assert BRACKET_ACTION_TAG.render("[A C]") == "<action>[A C]</action>"
    assert BRACKET_ACTION_TAG.parser.parse("I move <action>[A C]</action>") == "[A C]"


def test_unknown_ids_and_games_are_clear_errors():
    with pytest.raises(ConfigError, match="Unknown TextArena game 'TowerOfHanoi-v9'. Did you mean 'TowerOfHanoi-v0'"):
        make("textarena/TowerOfHanoi-v9")  # textarena/<any id> resolves through TextArena's own registry
    with pytest.raises(ConfigError, match="Unknown TextArena game 'GuessTheNumbr-v0'. Did you mean 'GuessTheNumber-v0'"):
        TextArenaEnv("GuessTheNumbr-v0")
    with pytest.raises(ConfigError, match="'ConnectFour-v0' does not start with one player"):
        TextArenaEnv("ConnectFour-v0").reset(seed=0)
    with pytest.raises(ConfigError, match=r"split must be one of \['train', 'eval'\], got 'test'"):
        TextArenaEnv(split="test")
    with pytest.raises(ConfigError, match="seeds for split 'train' run from 0 to 999999"):
        TextArenaEnv().reset(seed=-1)


def test_a_word_game_without_its_nltk_data_fails_with_one_line_naming_the_download():
    import nltk

    try:
        nltk.data.find("corpora/words")
        pytest.skip("NLTK's words corpus is installed here, so Wordle builds")
    except LookupError:
        pass
    with pytest.raises(MissingDependencyError) as err:
        make("agentkit.envs.textarena_env:TextArenaEnv", game="Wordle-v0")
    assert "\n" not in str(err.value) and "python -m nltk.downloader words" in str(err.value)


def test_any_single_player_game_plays_by_its_spec_or_the_import_path(monkeypatch):
    from agentkit.envs import REGISTRY, register
    from agentkit.envs.textarena_env import game_spec

    monkeypatch.setattr(REGISTRY, "_specs", dict(REGISTRY._specs))
    info = env_info("textarena/Sudoku-v0-easy")  # any TextArena id, with no registration
    assert info.action_format is BRACKET_ACTION_TAG and info.extra == "textarena"
    assert info.max_turns == ta.envs.registration.ENV_REGISTRY["Sudoku-v0-easy"].kwargs["max_turns"]
    assert game_spec("FrozenLake-v0", size=5).kwargs == {"game": "FrozenLake-v0", "size": 5}
    register("textarena/sudoku-easy", game_spec("Sudoku-v0-easy"))  # or under a name of one's own
    assert env_info("textarena/sudoku-easy").kwargs == info.kwargs
    for env in (make("textarena/Sudoku-v0-easy"), make("agentkit.envs.textarena_env:TextArenaEnv", game="FrozenLake-v0")):
        check_env(env, seed=1)
        obs, info = env.reset(seed=1)
        assert obs and "expert_plan" not in info and info["admissible_actions"] is None and info["privileged"] is None


# -- the contract ------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", IDS)
def test_check_env_and_gymnasium_check_env_pass(env_id):
    from gymnasium.utils.env_checker import check_env as gymnasium_check_env

    check_env(make(env_id), seed=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gymnasium_check_env(TextArenaEnv(env_info(env_id).kwargs["game"]))
    # the one note Gymnasium has: a bare environment has no spec to try other render modes with
    assert all("render modes" in str(w.message) for w in caught), [str(w.message) for w in caught]


@pytest.mark.parametrize("env_id", IDS)
def test_the_expert_wins_every_seed_within_the_registered_turn_limit(env_id):
    max_turns = env_info(env_id).max_turns
    for split in env_info(env_id).splits:
        env = make(env_id, split=split, max_turns=max_turns)
        for seed in range(10):
            won, steps = play_expert(env, seed, max_steps=max_turns)
            assert won and steps <= (5 if env_id == GUESS else 7), (split, seed, steps)


def test_the_cli_check_plays_the_expert(tmp_path):
    result = run_cli("envs", "check", HANOI, "--tasks", "3", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "check_env passed" in result.stdout and "expert won 3/3 tasks" in result.stdout


def test_reset_is_deterministic_by_seed_and_splits_are_disjoint_seed_ranges():
    actions = ["[10]", "[10]", "[5]", "[15]", "[3]"]
    assert play(make(GUESS), 7, actions) == play(make(GUESS), 7, actions)
    secrets = {split: [TextArenaEnv(split=split).reset(seed=s)[1]["privileged"].split(".")[0] for s in range(40)]
               for split in ("train", "eval")}
    assert len(set(secrets["train"])) > 10, "seeds pick different secrets"
    assert secrets["train"] != secrets["eval"]
    raw = ta.make("GuessTheNumber-v0-raw")
    raw.reset(num_players=1, seed=SEEDS_PER_SPLIT + 5)
    assert secrets["eval"][5] == f"The secret number is {raw.game_number}", "eval seed s is TextArena seed 1e6 + s"
    obs, info = make(HANOI).reset(seed=0)
    assert obs.startswith(info["task"]) and "Current Board:" in obs and "Current Board:" not in info["task"]
    assert make(HANOI).reset(seed=5)[0] == obs, "TextArena's Tower of Hanoi has one puzzle"


def test_the_game_has_its_own_random_state_and_leaves_the_callers_alone():
    """TextArena reseeds Python's global random at reset and 2048 draws from it at every step."""
    def game_2048(disturb: bool) -> list[str]:
        env = TextArenaEnv("2048-v0-ultra-easy")
        observations = [env.reset(seed=4)[0]]
        for action in ["[up]", "[left]", "[down]", "[right]"] * 2:
            if disturb:
                random.seed(99)
            observations.append(env.step(action)[0])
        return observations

    assert game_2048(False) == game_2048(True)
    random.seed(1234)
    expected = random.random()
    random.seed(1234)
    env = TextArenaEnv()
    env.reset(seed=3)
    env.step("[4]")
    assert random.random() == expected


# -- invalid moves and rewards --------------------------------------------------------------------------
@pytest.mark.parametrize(("env_id", "invalid"), [(GUESS, "[0]"), (GUESS, "hello"), (HANOI, "[B C]"), (HANOI, "[B D]")])
def test_invalid_moves_are_flagged_and_the_second_in_a_row_loses(env_id, invalid):
    env = make(env_id)
    _, info = env.reset(seed=2)
    obs, reward, terminated, _, info = env.step(invalid)
    assert not info["action_valid"] and not terminated and reward == 0.0
    assert obs.startswith("You attempted an invalid move.")
    obs, _, terminated, _, info = env.step(info["expert_plan"][0])
    assert info["action_valid"] and not terminated, "a valid move resets TextArena's error count"
    env.step(invalid)
    obs, reward, terminated, _, info = env.step(invalid)
    assert terminated and not info["action_valid"] and not info["won"] and obs.startswith("Invalid Move:")
    assert reward == info["score"], "TextArena's partial credit, paid on the last step"


def test_a_repeated_guess_is_invalid_and_text_without_the_tags_never_reaches_the_game():
    env = make(GUESS, action_parser="format")
    _, info = env.reset(seed=0)
    _, _, _, _, info = env.step("<action>[7]</action>")
    assert info["action_valid"] and info["action"] == "[7]" and "[7]" not in info["admissible_actions"]
    obs, _, _, _, info = env.step("<action>[7]</action>")
    assert not info["action_valid"] and "already guessed" in obs
    obs, _, terminated, _, info = env.step("I guess 7")
    assert obs == BRACKET_ACTION_TAG.invalid_feedback and not info["action_valid"] and not terminated
    _, _, _, _, info = env.step("<action>12</action>")  # bracketed for the game, as TextArena's wrapper does
    assert info["action_valid"] and info["action"] == "12"


@pytest.mark.parametrize("env_id", IDS)
def test_rewards_are_per_step_and_sum_to_the_score(env_id):
    env = make(env_id, action_parser="format")
    _, info = env.reset(seed=4)
    rewards = []
    while info["expert_plan"]:
        obs, reward, terminated, _, info = env.step(BRACKET_ACTION_TAG.render(info["expert_plan"][0]))
        rewards.append(reward)
    assert terminated and info["won"] and info["score"] == 1.0 and "Congratulations!" in obs
    assert rewards == [0.0] * (len(rewards) - 1) + [1.0]


def test_a_lost_game_pays_textarenas_partial_credit_once():
    env = TextArenaEnv()  # no turn limit of agentkit's: TextArena's own ends the game
    _, info = env.reset(seed=0)  # the secret is 13; guess far from it
    rewards, guess = [], 1
    terminated = False
    while not terminated:
        _, reward, terminated, _, info = env.step(f"[{guess}]")
        rewards.append(reward)
        guess += 1
    assert len(rewards) == 11, "TextArena's turn limit (10) lets an 11th guess through"
    assert not info["won"] and info["score"] == pytest.approx(1 - (13 - 11) / 19)
    assert rewards == [0.0] * 10 + [info["score"]]
    with pytest.raises(EnvError, match="call reset"):
        env.step("[12]")


# -- the experts -------------------------------------------------------------------------------------
def _hanoi_distances(disks: int) -> dict[tuple[str, ...], int]:
    """Breadth-first search: the fewest moves from every position (disk i's tower at index i-1) to all on C."""
    goal = ("C",) * disks
    distances, queue = {goal: 0}, deque([goal])
    while queue:
        position = queue.popleft()
        for source, target in itertools.permutations("ABC", 2):
            on_source = [d for d in range(disks) if position[d] == source]
            on_target = [d for d in range(disks) if position[d] == target]
            if on_source and (not on_target or min(on_target) > min(on_source)):
                moved = list(position)
                moved[min(on_source)] = target
                if tuple(moved) not in distances:
                    distances[tuple(moved)] = distances[position] + 1
                    queue.append(tuple(moved))
    return distances


@pytest.mark.parametrize("disks", [3, 4])
def test_the_hanoi_expert_takes_the_fewest_moves_from_every_position(disks):
    distances = _hanoi_distances(disks)
    assert len(distances) == 3 ** disks
    for position, distance in distances.items():
        towers = {name: [d + 1 for d in reversed(range(disks)) if position[d] == name] for name in "ABC"}
        moves = hanoi_moves(towers, "C")
        assert len(moves) == distance, position
        for source, target in moves:  # each move legal, and they end with every disk on C
            assert towers[source] and (not towers[target] or towers[target][-1] > towers[source][-1])
            towers[target].append(towers[source].pop())
        assert towers["C"] == list(range(disks, 0, -1))


def test_the_hanoi_expert_recovers_from_any_detour_and_lists_the_legal_moves():
    env = make(HANOI)
    rng = random.Random(0)
    for _ in range(5):
        _, info = env.reset(seed=0)
        for _ in range(rng.randrange(1, 6)):
            _, _, terminated, _, info = env.step(rng.choice(info["admissible_actions"]))
            assert info["action_valid"]
            if terminated:
                break
        plan = info["expert_plan"]
        assert info["privileged"] == f"The fewest moves from here ({len(plan)}): {', '.join(plan)}."
        for action in plan:
            _, _, terminated, _, info = env.step(action)
        assert terminated and info["won"]


def test_the_guess_expert_is_a_binary_search_from_the_hints_so_far():
    env = make(GUESS)
    for seed in range(20):
        _, info = env.reset(seed=seed)
        secret = int(info["privileged"].split()[4].rstrip("."))
        assert len(info["expert_plan"]) <= 5 and info["expert_plan"][-1] == f"[{secret}]"
        wrong = next(n for n in (1, 20) if n != secret)
        _, _, _, _, info = env.step(f"[{wrong}]")
        plan = info["expert_plan"]
        low, high = (wrong + 1, 20) if wrong < secret else (1, wrong - 1)
        assert plan[0] == f"[{(low + high) // 2}]" and plan[-1] == f"[{secret}]"


# -- the commands, with the shipped default model ------------------------------------------------------
def test_rollout_with_the_default_model_writes_trajectories(tmp_path):
    out = tmp_path / "ta.jsonl"
    result = run_cli("rollout", "--env", GUESS, "--episodes", "2", "--out", str(out), "--quiet", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    trajectories = read_trajectories(out, strict=True)
    assert len(trajectories) == 2 and sorted(t.seed for t in trajectories) == [0, 1]
    for trajectory in trajectories:
        assert trajectory.env == GUESS and 1 <= len(trajectory.turns) <= env_info(GUESS).max_turns
        assert trajectory.task.startswith("You are Player 0. You are playing Guess The Number.")
        assert trajectory.episode_return == pytest.approx(sum(turn.reward for turn in trajectory.turns))


def test_demos_record_the_expert_in_the_bracket_format(tmp_path):
    out = tmp_path / "demos.jsonl"
    result = run_cli("demos", "--env", HANOI, "--episodes", "2", "--out", str(out), "--quiet", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    demos = read_trajectories(out, strict=True)
    assert len(demos) == 2 and all(d.won and len(d.turns) == 7 for d in demos)
    assert [turn.response_text for turn in demos[0].turns][:2] == ["<action>[A C]</action>", "<action>[A B]</action>"]
    assert all(turn.action_valid for turn in demos[0].turns)
