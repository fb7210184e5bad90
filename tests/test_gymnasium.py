"""Gymnasium, both ways: every registered environment is a ``gymnasium.Env`` that passes Gymnasium's
``check_env`` through ``gymnasium.make("agentkit/...")``, and ``GuessWord`` below, a plain
``gymnasium.Env`` that is not agentkit's, plays in agentkit unchanged."""

from __future__ import annotations

import os
import string
import subprocess
import sys
from pathlib import Path

import gymnasium
import pytest
from agentkit.envs import (
    INFO_KEYS,
    REGISTRY,
    FromGymnasium,
    TextEnv,
    check_env,
    env_info,
    gymnasium_id,
    make,
    register,
)
from agentkit.envs.gym import GYMNASIUM_PREFIX, AsGymnasium, CleanText
from agentkit.envs.registry import missing_requirements
from gymnasium.spaces import Discrete, Text
from gymnasium.utils import env_checker

from agentkit.core.errors import ConfigError, EnvError, MissingDependencyError, PluginError, UnknownNameError
from agentkit.core.jsonl import read_trajectories

FRUITS = ("apple", "berry", "lemon", "mango", "peach")


class GuessWord(gymnasium.Env):
    """Guess the secret fruit; a wrong guess says how many of its letters are in place. A plain
    Gymnasium environment: no agentkit info keys, and a prompt character after each observation."""

    metadata = {"render_modes": []}

    def __init__(self, words: tuple[str, ...] = FRUITS) -> None:
        self.words = tuple(words)
        self.observation_space = Text(max_length=500, min_length=1, charset=string.printable)
        self.action_space = Text(max_length=20, min_length=1, charset=string.ascii_lowercase)
        self.secret = ""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.secret = self.words[int(self.np_random.integers(len(self.words)))]
        return f"Guess the fruit: one of {', '.join(self.words)}.\n> ", {}

    def step(self, action):
        guess = action.strip().lower()
        if guess == self.secret:
            return "Right!", 1.0, True, False, {"is_success": True}
        in_place = sum(a == b for a, b in zip(guess, self.secret, strict=False))
        return f"No: {in_place} letters in place.\n> ", 0.0, False, False, {"is_success": False}


class GuessNumber(GuessWord):
    """The same game with a Discrete action space: not text, so agentkit refuses it."""

    def __init__(self) -> None:
        super().__init__()
        self.action_space = Discrete(len(self.words))


# the registration a Gymnasium user writes; `gymnasium/test_gymnasium:GuessWord-v0` imports this module first
gymnasium.register("GuessWord-v0", entry_point=GuessWord, max_episode_steps=6)

# game generation (TextWorld, ALFWorld) or a JVM (ScienceWorld): 20-45 s each on two cores
SLOW_FAMILIES = ("textworld/", "alfworld/", "scienceworld/")
BUILTIN_IDS = [spec.name for spec in REGISTRY.specs() if spec.distribution == "agentkit"]


def _builtin(env_id: str):
    return pytest.param(env_id, marks=[pytest.mark.slow] if env_id.startswith(SLOW_FAMILIES) else [])


def _skip_unless_installed(env_id: str) -> None:
    missing = missing_requirements(env_info(env_id))
    if missing:
        pytest.skip(f"{env_id} needs {', '.join(missing)}: pip install 'agentkit[{env_info(env_id).extra}]'")


def _gymnasium_warnings(monkeypatch) -> list[str]:
    """Gymnasium's passive checks warn (logger.warn) rather than fail: collect them, to fail on them."""
    warned: list[str] = []
    monkeypatch.setattr(gymnasium.logger, "warn", lambda msg, *args, **_: warned.append(msg % args if args else msg))
    return warned


# -- agentkit's environments in Gymnasium ------------------------------------------------------------
def test_gymnasium_ids():
    assert gymnasium_id("textworld/coin-v0") == "agentkit/textworld-coin-v0"
    assert gymnasium_id("vaults/vaults-v0") == "agentkit/vaults-v0"  # the family once
    assert gymnasium_id("search-qa/generated-v0") == "agentkit/search-qa-generated-v0"
    assert gymnasium_id("plain") == "agentkit/plain"
    for bad in ("a/b/c-v0", "package.module:Env", "two words/x-v0"):
        with pytest.raises(ConfigError, match="has no Gymnasium id: ids are 'name' or 'name/Variant-vN'"):
            gymnasium_id(bad)


def test_every_id_is_registered_with_gymnasium():
    ids = [name for name in REGISTRY.names() if not name.startswith(GYMNASIUM_PREFIX)]
    assert set(BUILTIN_IDS) <= set(ids)
    assert len({gymnasium_id(env_id) for env_id in ids}) == len(ids), "one Gymnasium id per agentkit id"
    for env_id in ids:
        spec, info = gymnasium.spec(gymnasium_id(env_id)), env_info(env_id)
        assert spec.kwargs == {"agentkit_id": env_id}
        assert spec.max_episode_steps == info.max_turns
        assert spec.nondeterministic is info.nondeterministic
        assert [w.name for w in spec.additional_wrappers] == ["CleanText"]


@pytest.mark.parametrize("env_id", [_builtin(env_id) for env_id in BUILTIN_IDS])
def test_check_env(env_id, monkeypatch):
    """Gymnasium's own checker on the environment gymnasium.make builds (its passive warnings fail)."""
    _skip_unless_installed(env_id)
    warned = _gymnasium_warnings(monkeypatch)
    try:
        env = gymnasium.make(gymnasium_id(env_id))
    except MissingDependencyError as err:  # data that is not here (webshop/original-v0)
        pytest.skip(str(err))
    try:
        assert isinstance(env.unwrapped, TextEnv)
        env.unwrapped.reset(seed=0)  # the checker's first reset is unseeded: play a known task (cached games)
        env_checker.check_env(env.unwrapped)
    finally:
        env.close()
    assert not warned


def test_gymnasium_seeds_wrap_agentkit_seeds_do_not():
    """A Gymnasium seed within the split is agentkit's task seed; past it, it wraps around, which
    agentkit's own make refuses."""
    ours, theirs = make("vaults/vaults-v0"), gymnasium.make("agentkit/vaults-v0")
    try:
        assert theirs.reset(seed=3)[0] == ours.reset(seed=3)[0]
        assert theirs.reset(seed=1_000_003)[0] == ours.reset(seed=3)[0]
        with pytest.raises(ConfigError, match=r"seeds for split 'train' run from 0 to 999999, got 1000003"):
            ours.reset(seed=1_000_003)
        with pytest.raises(ConfigError, match=r"run from 0 to 999999, got -1"):
            theirs.reset(seed=-1)
        first = [theirs.reset(seed=7)[0], theirs.reset()[0], theirs.reset()[0]]
        again = [theirs.reset(seed=7)[0], theirs.reset()[0], theirs.reset()[0]]
        assert first == again, "unseeded resets after a seeded one replay the same tasks"
        assert len(set(first)) == 3
    finally:
        ours.close()
        theirs.close()


def test_gymnasium_make_passes_settings_and_limits_turns():
    env = gymnasium.make("agentkit/vaults-v0", families="amber", chambers=2, max_episode_steps=2)
    try:
        assert isinstance(env, CleanText)
        assert env.unwrapped.families == ("amber",) and env.unwrapped.num_chambers == 2
        obs, info = env.reset(seed=0)
        assert "amber vault" in obs and set(INFO_KEYS) <= set(info)
        _, _, terminated, truncated, info = env.step("go back")  # bare commands: no action tags
        assert not (terminated or truncated) and info["action_valid"] is False
        _, _, terminated, truncated, _ = env.step("go anchor")
        assert truncated and not terminated
    finally:
        env.close()
    assert gymnasium.spec("agentkit/vaults-v0").max_episode_steps == env_info("vaults/vaults-v0").max_turns


def test_register_gymnasium_adds_entry_point_plugins(plugin_site):
    """Entry-point plugins are imported only when asked for: register_gymnasium() asks."""
    code = ("import gymnasium, agentkit.envs\n"
            "assert 'agentkit/demo-lock-v0' not in gymnasium.registry\n"
            "assert 'agentkit/demo-lock-v0' in agentkit.envs.register_gymnasium()\n"
            "env = gymnasium.make('agentkit/demo-lock-v0')\n"
            "print(type(env.unwrapped).__name__, env.spec.max_episode_steps, env.unwrapped.length)\n")
    path = os.pathsep.join(filter(None, [str(plugin_site), os.environ.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": path})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["CombinationLock", "20", "3"]


# -- Gymnasium's environments in agentkit -----------------------------------------------------------
def _win(env) -> tuple[float, dict]:
    """Guess every fruit until one is right; return the last reward and info."""
    obs, info = env.reset(seed=0)
    assert not obs.endswith(">"), "observations are cleaned"
    for fruit in FRUITS:
        obs, reward, terminated, _, info = env.step(fruit)
        if terminated:
            return reward, info
    raise AssertionError("no fruit won")


def test_gymnasium_id_plays_a_gymnasium_env():
    info = env_info("gymnasium/GuessWord-v0")
    assert info.max_turns == 6 and info.distribution == "gymnasium" and info.splits == ("train",)
    env = make("gymnasium/GuessWord-v0")
    try:
        check_env(env)  # agentkit's protocol check: FromGymnasium fills the info keys it lacks
        reward, info = _win(env)
        assert reward == 1.0 and info["won"] and info["score"] == 1.0 and info["action_valid"]
    finally:
        env.close()


def test_registered_gymnasium_env_plugs_in_unchanged(monkeypatch):
    register("test/guess-v0", GuessWord, max_turns=6, overwrite=True)
    gym_env = gymnasium.make("agentkit/test-guess-v0")
    try:
        assert type(gym_env.unwrapped) is GuessWord
        warned = _gymnasium_warnings(monkeypatch)
        env_checker.check_env(gym_env.unwrapped)
        assert not warned
        assert _win(gym_env)[0] == 1.0
    finally:
        gym_env.close()
    env = make("test/guess-v0")
    try:
        with pytest.raises(EnvError, match=r"lacks the required key\(s\) \['task'.*agentkit.envs.FromGymnasium"):
            check_env(env)  # played as it is: its info must carry agentkit's keys
    finally:
        env.close()
    check_env(FromGymnasium(GuessWord()))


class Counter:
    """An agentkit environment that is not a gymnasium.Env: the protocol alone."""

    def reset(self, *, seed=None, options=None):
        self.count = 0
        return f"room {seed}", self._info()

    def step(self, action):
        self.count += 1
        return f"step {self.count}", 0.0, False, False, self._info()

    def _info(self):
        return {"task": "count", "admissible_actions": None, "action_valid": True, "won": False,
                "score": float(self.count), "privileged": None}

    def close(self):
        pass


def test_plain_protocol_env_is_adapted_for_gymnasium():
    register("test/plain-protocol-v0", Counter, max_turns=3, overwrite=True)
    env = gymnasium.make("agentkit/test-plain-protocol-v0")
    try:
        assert isinstance(env.unwrapped, AsGymnasium)
        assert env.reset(seed=4)[0] == "room 4"
        assert env.step("wait")[0] == "step 1"
    finally:
        env.close()


def test_non_text_spaces_are_refused():
    with pytest.raises(EnvError, match=r"^Environment 'gymnasium/CartPole-v1' is a Gymnasium environment with a Box "
                                       r"observation space and a Discrete action space; agentkit plays text"):
        make("gymnasium/CartPole-v1")
    register("test/guess-number-v0", GuessNumber, overwrite=True)
    for build in (lambda: make("test/guess-number-v0"), lambda: gymnasium.make("agentkit/test-guess-number-v0")):
        with pytest.raises(EnvError, match="a Text observation space and a Discrete action space; agentkit plays text"):
            build()


def test_bad_gymnasium_ids_are_clear():
    with pytest.raises(UnknownNameError, match=r"Unknown Gymnasium environment 'GuessWrd-v0'.*GuessWord"):
        make("gymnasium/GuessWrd-v0")
    with pytest.raises(ConfigError, match=r"gymnasium/GuessWord-v0 has one task set \(split 'train'\)"):
        make("gymnasium/GuessWord-v0", split="eval")
    register("test/clash-v0", GuessWord, overwrite=True)
    with pytest.raises(PluginError, match=r"would be Gymnasium's 'agentkit/test-clash-v0', which is 'test/clash-v0'"):
        register("test-clash-v0", GuessWord)
    assert "test-clash-v0" not in REGISTRY.names(), "nothing registered"


def test_rollout_cli_plays_a_gymnasium_env(tiny_model_dir, tmp_path):
    """`agentkit rollout --env gymnasium/<module>:<Gymnasium id>` with the tiny model, as a user runs it."""
    out = tmp_path / "guess.jsonl"
    env_id = "gymnasium/test_gymnasium:GuessWord-v0"
    path = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-m", "agentkit.cli", "rollout", "--env", env_id, "--model", str(tiny_model_dir),
         "--episodes", "2", "--max-turns", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": path},
    )
    assert result.returncode == 0, result.stderr
    trajectories = read_trajectories(out, strict=True)
    assert len(trajectories) == 2 and all(t.env == env_id and 1 <= len(t.turns) <= 2 for t in trajectories)
    assert all("Guess the fruit" in t.turns[0].observation for t in trajectories)
