"""The environment protocol, registry, wrappers and the TextWorld adapter (real generated games)."""

from __future__ import annotations

import pytest
from agentkit.envs import REGISTRY, ActionParser, check_env, clean_text, make, register
from agentkit.envs.wrappers import INVALID_FORMAT_FEEDBACK
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkit.core.errors import ConfigError, EnvError, UnknownNameError

textworld = pytest.importorskip("textworld", reason="needs the textworld extra")

TEXTWORLD_IDS = [n for n in REGISTRY.names() if n.startswith("textworld/")]


def test_unknown_id_did_you_mean_and_extra():
    with pytest.raises(UnknownNameError, match=r"Did you mean 'textworld/coin-v0'.*pip install 'agentkit\[textworld\]'"):
        make("textworld/coins-v0")
    with pytest.raises(UnknownNameError, match=r"Unknown environment 'nothing-v0'\.") as info:
        make("nothing-v0")
    assert "pip install" not in str(info.value)


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


def test_invalid_commands_are_flagged_not_raised():
    env = make("textworld/coin-v0")
    try:
        env.reset(seed=2)
        for bad in ("xyzzy", "take the moon", "", "go nowhere" * 50, "\\quit", "\\restart", "\u00e9\u00e8 \x00", "quit"):
            _, reward, terminated, _, info = env.step(bad)
            assert info["action_valid"] is False and reward == 0 and not terminated
    finally:
        env.close()


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
    """Gymnasium's habit: one test walks every registered environment through the checker."""
    from agentkit.envs import play_expert

    if env_id.startswith("scienceworld/"):
        import shutil

        if shutil.which("java") is None:
            pytest.skip("scienceworld needs Java (apt-get install -y openjdk-17-jre-headless)")
    env = _buildable(env_id)
    try:
        check_env(env, seed=0)
        won, steps = play_expert(env, seed=1)
        assert won, f"{env_id}: the expert plan lost on task 1 after {steps} steps"
    finally:
        env.close()
