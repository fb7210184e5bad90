"""The environment protocol, registry, wrappers and the TextWorld adapter (real generated games)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from agentkit.envs import (
    ACTION_TAG,
    REGISTRY,
    ActionFormat,
    ActionParser,
    EnvSpec,
    check_env,
    clean_text,
    env_info,
    make,
    play_expert,
    register,
    status,
)
from agentkit.envs.wrappers import INVALID_FORMAT_FEEDBACK
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkit.core.errors import ConfigError, EnvError, PluginError, UnknownNameError

needs_textworld = pytest.mark.skipif(importlib.util.find_spec("textworld") is None,
                                     reason="needs the textworld extra: pip install 'agentkit[textworld]'")
TEXTWORLD_IDS = [n for n in REGISTRY.names() if n.startswith("textworld/")]
BUILTIN_IDS = [spec.name for spec in REGISTRY.specs() if spec.distribution == "agentkit"]


def test_unknown_id_did_you_mean_and_extra():
    with pytest.raises(UnknownNameError, match=r"Did you mean 'textworld/coin-v0'.*pip install 'agentkit\[textworld\]'"):
        make("textworld/coins-v0")
    with pytest.raises(UnknownNameError, match=r"Unknown environment 'nothing-v0'\.") as info:
        make("nothing-v0")
    assert "pip install" not in str(info.value)


@needs_textworld
@pytest.mark.parametrize("env_id", TEXTWORLD_IDS)
def test_check_env_and_expert_plan_wins(env_id):
    env = make(env_id, split="train")
    try:
        check_env(env, seed=1)
        obs, info = env.reset(seed=1)
        assert "$$" not in obs and obs.strip(), "banner and prompt junk are stripped"
        assert info["privileged"].startswith("Expert plan")
        total = 0.0
        for action in info["expert_plan"]:
            obs, reward, terminated, truncated, info = env.step(action)
            assert info["action_valid"], action
            assert not obs.rstrip().endswith(">"), "prompt character stripped"
            total += reward
        assert terminated and info["won"]
        assert total == pytest.approx(info["score"]), "rewards are per-step differences summing to the score"
    finally:
        env.close()


@needs_textworld
def test_invalid_commands_are_flagged_not_raised():
    env = make("textworld/coin-v0")
    try:
        env.reset(seed=2)
        for bad in ("xyzzy", "take the moon", "", "go nowhere" * 50, "\\quit", "\\restart", "\u00e9\u00e8 \x00", "quit"):
            _, reward, terminated, _, info = env.step(bad)
            assert info["action_valid"] is False and reward == 0 and not terminated
    finally:
        env.close()


@needs_textworld
def test_seeds_are_deterministic_and_splits_disjoint():
    train, evals = make("textworld/simple-v0", split="train"), make("textworld/simple-v0", split="eval")
    try:
        a, _ = train.reset(seed=0)
        b, _ = train.reset(seed=0)
        c, _ = evals.reset(seed=0)
        d, _ = train.reset(seed=1)
        assert a == b
        assert a != c, "eval seed 0 is a different game from train seed 0"
        assert a != d
    finally:
        train.close()
        evals.close()


@needs_textworld
def test_coin_collector_brief_goal_hides_the_route_not_the_plan():
    detailed, brief = make("textworld/coin-v0", level=3), make("textworld/coin-v0", level=3, goal="brief")
    try:
        obs_d, info_d = detailed.reset(seed=5)
        obs_b, info_b = brief.reset(seed=5)
        plan = info_d["expert_plan"]
        moves = [a.split()[-1] for a in plan if a.startswith("go ")]
        assert moves and all(m in info_d["task"] for m in moves), "the detailed instruction spells the route"
        assert info_b["task"] == obs_b.split("\n\n")[0] == "Find the coin and take it."
        instruction = obs_d.split("\n\n-= ")[0]
        assert obs_b == obs_d.replace(instruction, "Find the coin and take it.", 1), "same game, only the instruction differs"
        assert info_b["expert_plan"] == plan and info_b["privileged"] == info_d["privileged"]
        for action in plan:
            *_, info_b = brief.step(action)
        assert info_b["won"]
    finally:
        detailed.close()
        brief.close()
    with pytest.raises(ConfigError, match="goal='hidden' is not one of \\['detailed', 'brief'\\]"):
        make("textworld/coin-v0", goal="hidden")


def test_bad_settings_are_clear():
    with pytest.raises(ConfigError, match="tw-coin_collector has no setting.*'rewards'"):
        make("textworld/coin-v0", rewards="dense")
    with pytest.raises(ConfigError, match="split must be 'train' or 'eval'"):
        make("textworld/coin-v0", split="test")


@needs_textworld
def test_turn_limit_and_action_parsing_wrappers():
    env = make("textworld/coin-v0", max_turns=3, action_parser=ActionParser())
    try:
        obs, info = env.reset(seed=3)
        _, _, terminated, truncated, info = env.step("I think... no tags here")
        assert info["action_valid"] is False and info["action"] is None and not truncated
        plan = env.reset(seed=3)[1]["expert_plan"]
        _, _, _, truncated, info = env.step(f"<action>{plan[0]}</action>")
        assert info["action"] == plan[0] and info["action_valid"] and not truncated
        env.step("<action>look</action>")
        _, _, terminated, truncated, _ = env.step("<action>look</action>")
        assert truncated and not terminated
    finally:
        env.close()


@needs_textworld
def test_registered_factory_callable_and_kwargs():
    register("test/coin-small-v0", "agentkit.envs.textworld_env:TextWorldEnv", challenge="tw-coin_collector", level=1,
             overwrite=True)
    env = make("test/coin-small-v0")
    try:
        _, info = env.reset(seed=0)
        assert len(info["expert_plan"]) >= 1
    finally:
        env.close()


class _NoInfoEnv:
    def reset(self, *, seed=None, options=None):
        return "hi", {"task": "t"}

    def step(self, action):
        return "x", 0.0, False, False, {}

    def close(self):
        pass


def test_check_env_names_missing_info_keys():
    with pytest.raises(EnvError, match=r"lacks the required key\(s\) \['admissible_actions'"):
        check_env(_NoInfoEnv())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<action>go north</action>", "go north"),
        ("think <action>look</action> no wait <action>take key</action>", "take key"),
        ("<ACTION> Open   Door </ACTION>", "Open Door"),
        ("<action></action>", None),
        ("no tags", None),
        ("<action>go\x00 north\x07</action>", "go north"),
        ("<action><action>go</action></action>", "<action>go"),
    ],
)
def test_action_parser(text, expected):
    assert ActionParser().parse(text) == expected


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_action_parser_never_raises(text):
    result = ActionParser().parse(text)
    assert result is None or (result and len(result) <= 300 and result == result.strip())


def test_clean_text_strips_prompt_and_status():
    raw = "\nYou open the door.\n\n\n\nYour score went up.\n\n>                       -= Bedroom =-0/1"
    assert clean_text(raw) == "You open the door.\n\nYour score went up."
    assert INVALID_FORMAT_FEEDBACK.startswith("Invalid action")


def _buildable(env_id: str):
    from agentkit.core.errors import MissingDependencyError

    try:
        return make(env_id)
    except MissingDependencyError as err:
        pytest.skip(f"{env_id}: {err}")


@pytest.mark.parametrize("env_id", REGISTRY.names())
def test_every_registered_environment_passes_check_env_and_its_expert_wins(env_id):
    """Gymnasium's habit: one test walks every registered environment through the checker; the
    expert then wins 2 tasks within the environment's registered turn limit."""
    if env_id.startswith("scienceworld/"):
        import shutil

        if shutil.which("java") is None:
            pytest.skip("scienceworld needs Java (apt-get install -y openjdk-17-jre-headless)")
    env = _buildable(env_id)
    max_turns = env_info(env_id).max_turns  # the registered turn limit must fit the expert's plans
    try:
        check_env(env, seed=0)
        for seed in (0, 1):
            won, steps = play_expert(env, seed=seed, max_steps=max_turns)
            assert won, f"{env_id}: the expert lost task {seed} after {steps} steps (registered max_turns {max_turns})"
    finally:
        env.close()


# -- registrations carry the environment's defaults ----------------------------------------------
def test_env_info_of_every_builtin_imports_nothing():
    """Commands fill their defaults from env_info: it must not build the environment or import its
    adapter (which may need a missing extra)."""
    code = (
        "import sys\n"
        "from agentkit.envs import REGISTRY, env_info\n"
        "infos = [env_info(s.name) for s in REGISTRY.specs() if s.distribution == 'agentkit']\n"
        "print(len(infos), sorted(m for m in sys.modules if m.startswith('agentkit.') and m.endswith('_env') or m in "
        "('textworld', 'alfworld', 'scienceworld', 'bm25s', 'textarena')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(" ", 1)
    assert int(out[0]) == len(BUILTIN_IDS) >= 10 and out[1].strip() == "[]"


@pytest.mark.parametrize("env_id", BUILTIN_IDS)
def test_builtin_env_info_is_complete(env_id):
    info = env_info(env_id)
    assert info.id == env_id and info.distribution == "agentkit" and info.description
    assert info.max_turns > 0 and "train" in info.splits and info.eval_split in info.splits
    assert isinstance(info.action_format, ActionFormat) and info.action_format.instruction
    assert info.kwargs == dict(REGISTRY.spec(env_id).defaults)
    info.kwargs["level"] = 99  # a copy: the registration is unchanged
    assert "level" not in env_info(env_id).kwargs or env_info(env_id).kwargs["level"] != 99


def test_make_with_the_format_parser(monkeypatch):
    monkeypatch.setattr(REGISTRY, "_specs", dict(REGISTRY._specs))
    tagged = ActionFormat("Answer [like this].", stop=("]",), parser=ActionParser(pattern=r"\[(.*?)\]"),
                          template="[{action}]", invalid_feedback="Use [brackets].")
    register("test/vaults-brackets-v0", EnvSpec("agentkit.envs.vaults_env:VaultsEnv", action_format=tagged))
    env = make("test/vaults-brackets-v0", action_parser="format")
    try:
        _, info = env.reset(seed=0)
        plan = info["expert_plan"]
        obs, _, _, _, info = env.step("go north")
        assert obs == "Use [brackets]." and not info["action_valid"]
        _, _, _, _, info = env.step(f"I pick {tagged.render(plan[0])}")
        assert info["action"] == plan[0] and info["action_valid"]
    finally:
        env.close()
    raw = make("vaults/vaults-v0")  # no parser unless asked: experts and checkers send bare commands
    try:
        _, info = raw.reset(seed=0)
        assert raw.step(info["expert_plan"][0])[4]["action_valid"]
    finally:
        raw.close()
    assert ACTION_TAG.render("go north") == "<action>go north</action>"
    assert ACTION_TAG.parser.parse(ACTION_TAG.render("go north")) == "go north"


def test_register_and_specs_are_checked(monkeypatch):
    monkeypatch.setattr(REGISTRY, "_specs", dict(REGISTRY._specs))
    with pytest.raises(ConfigError, match=r"takes its settings from the EnvSpec; also given: \['max_turns'\]"):
        register("test/x-v0", EnvSpec("agentkit.envs.vaults_env:VaultsEnv"), max_turns=3)
    with pytest.raises(ConfigError, match="eval_split 'dev' is not one of its splits"):
        EnvSpec("agentkit.envs.vaults_env:VaultsEnv", eval_split="dev")
    with pytest.raises(ConfigError, match="must contain '{action}'"):
        ActionFormat("Answer.", template="<action></action>")
    register("test/plain-v0", "agentkit.envs.vaults_env:VaultsEnv", level=2)
    info = env_info("test/plain-v0")
    assert (info.kwargs, info.max_turns, info.splits, info.eval_split, info.action_format) == (
        {"level": 2}, 20, ("train",), "train", ACTION_TAG)
    with pytest.raises(PluginError, match=r"resolved to '\{action\}'; expected an agentkit.envs.EnvSpec"):
        env_info("agentkit.envs.formats:ACTION_PLACEHOLDER")  # a string, not an environment


def test_status_says_unavailable_when_a_required_module_does_not_import(monkeypatch):
    monkeypatch.setattr(REGISTRY, "_specs", dict(REGISTRY._specs))
    register("test/needs-missing-v0", "agentkit.envs.vaults_env:VaultsEnv", requires=("agentkit_no_such_module",),
             extra="textworld", description="needs a module that is not installed")
    rows = {row.id: row for row in status()}
    row = rows["test/needs-missing-v0"]
    assert not row.available
    assert "agentkit_no_such_module (ModuleNotFoundError" in row.detail and "pip install 'agentkit[textworld]'" in row.detail
    assert rows["vaults/vaults-v0"].available and rows["vaults/vaults-v0"].detail == env_info("vaults/vaults-v0").description


_PLUGIN_CHECK = """
import json, sys
from agentkit.envs import ACTION_TAG, env_info, make, status
from agentkit.rollout import Collector, EpisodeSpec, SamplingParams
from agentkit.rollout.hf_backend import HFBackend

info, bare = env_info("demo/lock-brackets-v0"), env_info("demo/lock-v0")
env = make("demo/lock-brackets-v0", action_parser="format")
_, start = env.reset(seed=0)
move = start["expert_plan"][0]
bad = env.step(move)
good = env.step(info.action_format.render(move))
env.close()
trajectories = []
backend = HFBackend(sys.argv[1], seed=0)
Collector(backend, lambda: make("demo/lock-brackets-v0", action_parser="format", max_turns=1), env_id="demo/lock-brackets-v0",
          sampling=SamplingParams(max_new_tokens=6)).run([EpisodeSpec(0)], trajectories.append)
print(json.dumps({
    "spec": [info.max_turns, list(info.splits), info.eval_split, info.distribution, info.kwargs],
    "bare": [bare.max_turns, list(bare.splits), bare.action_format == ACTION_TAG],
    "bad": [bad[0], bad[4]["action_valid"]], "good": [good[4]["action"], good[4]["action_valid"]],
    "prompt": backend.tokenizer.decode(trajectories[0].turns[0].context_ids), "stop": trajectories[0].sampling["stop"],
    "listed": {row.id: row.detail for row in status() if row.id.startswith("demo/")},
}))
"""


def test_a_plugin_declares_its_own_action_format(plugin_site, tiny_model_dir):
    """The demo distribution registers demo/lock-brackets-v0 as an EnvSpec (answers in [brackets]) by
    entry point: its instruction is the system prompt, its stop string ends generation, its parser
    reads the answers; demo/lock-v0, a bare class, gets the defaults."""
    import json
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(plugin_site), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", _PLUGIN_CHECK, str(tiny_model_dir)], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["spec"] == [6, ["train", "eval"], "eval", "agentkit-plugin-demo", {"length": 3}]
    assert got["bare"] == [20, ["train"], True]
    assert got["bad"] == ["Write one command in square brackets, for example [turn red].", False]
    assert got["good"][1] and got["good"][0].startswith("turn ")
    assert "You open combination locks. Answer with one command in square brackets" in got["prompt"]
    assert "<action>" not in got["prompt"] and got["stop"] == ["]"]
    assert got["listed"] == {"demo/lock-brackets-v0": "A combination lock; answers in [brackets] (length)",
                             "demo/lock-v0": ""}


@needs_textworld
@pytest.mark.parametrize("challenge", ["tw-simple", "tw-coin_collector", "tw-treasure_hunter", "tw-cooking"])
def test_textworld_kept_openings_play_exactly_like_textworld_start(challenge):
    """Resets copy each game's opening (read and searched once per process); every state must equal
    the one ``textworld.start`` gives for the same commands, with games switched, replayed, and two
    environments playing one game at once."""
    import random

    import textworld
    from agentkit.envs.textworld_env import TextWorldEnv

    keys = ("feedback", "admissible_commands", "policy_commands", "score", "max_score", "won", "lost", "moves",
            "objective")
    rng = random.Random(challenge)
    envs = [TextWorldEnv(challenge), TextWorldEnv(challenge)]
    try:
        for seed in (1, 0, 1, 1, 0):  # a new game, another, back to the first, the same again, ...
            for env in envs:
                env.reset(seed=seed)
            plain = [textworld.start(str(env._game_file), request_infos=env._infos()) for env in envs]
            states = [reference.reset() for reference in plain]
            for turn in range(12):
                for i, (env, reference) in enumerate(zip(envs, plain, strict=True)):
                    assert {k: env._state[k] for k in keys} == {k: states[i][k] for k in keys}, (seed, turn, i)
                    if env._done:
                        continue
                    plan, moves = states[i]["policy_commands"], states[i]["admissible_commands"]
                    command = rng.choice([plan[0] if plan else "look", rng.choice(moves), "dance wildly"])
                    env.step(command)
                    states[i], _, _ = reference.step(command)
            for reference in plain:
                reference.close()
    finally:
        for env in envs:
            env.close()
