"""The ScienceWorld adapter against the real simulator (its JVM), no mocks.

One JVM (the module's ``env``, all 30 tasks of the train split) serves most tests; a few tests
start a second, short-lived one, so at most two run at a time.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import shutil
import signal
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
from agentkit.envs.checker import check_env

from agentkit.core.errors import ConfigError, EnvError, MissingDependencyError

pytest.importorskip("scienceworld", reason="needs the scienceworld extra: pip install 'agentkit[scienceworld]'")
if shutil.which("java") is None:
    pytest.skip("ScienceWorld needs Java: apt-get install -y openjdk-17-jre-headless", allow_module_level=True)

from agentkit.envs.scienceworld_env import ScienceWorldEnv, _child_java_options, task_names  # noqa: E402

pytestmark = pytest.mark.java

# train seeds of the all-task environment: seed i < 30 is the first train variation of task i
BOIL, POWER_COMPONENT, FIND_LIVING_THING, GROW_PLANT, PAINT_SECONDARY, LIFESPAN_LONGEST = 0, 7, 11, 15, 18, 20


@pytest.fixture(scope="module")
def env():
    env = ScienceWorldEnv(split="train")
    yield env
    env.close()


def _rss_mb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) // 1024


def _java_children() -> list[int]:
    """Pids of the java processes this test process started."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm, fields = text.split("(", 1)[1].rsplit(")", 1)[0], text.rsplit(")", 1)[1].split()
        if int(fields[1]) == os.getpid() and comm == "java":
            pids.append(int(stat.parent.name))
    return pids


def test_check_env(env):
    check_env(env)
    check_env(env, seed=FIND_LIVING_THING)


def test_seeds_interleave_tasks(env):
    assert env.num_tasks > 3000
    first = [env.task_for_seed(s) for s in range(30)]
    assert [task for task, _ in first] == task_names(), "seeds 0-29: every task once, in ScienceWorld's order"
    assert env.task_for_seed(30)[0] == "boil" and env.task_for_seed(30)[1] != env.task_for_seed(0)[1]
    with pytest.raises(ConfigError, match=r"seeds of the 'train' split .* run from 0 to \d+, got -1"):
        env.reset(seed=-1)
    with pytest.raises(ConfigError, match="got 1000000"):
        env.task_for_seed(1_000_000)


@pytest.mark.parametrize("seed", [BOIL, POWER_COMPONENT, GROW_PLANT, PAINT_SECONDARY, LIFESPAN_LONGEST])
def test_gold_sequence_wins(env, seed):
    obs, info = env.reset(seed=seed)
    assert obs.startswith("This room is called")
    assert info["task"].startswith("Your task is")
    assert info["score"] == 0.0 and info["action_valid"] and not info["won"]
    gold = list(info["expert_plan"])
    assert gold and info["privileged"] == "Gold action sequence from the start: " + " > ".join(gold)
    total = 0.0
    for played, action in enumerate(gold, 1):
        obs, reward, terminated, truncated, info = env.step(action)
        total += reward
        # the gold sequences answer some ambiguous requests with a number: only those turns are invalid
        assert info["action_valid"] or obs.startswith("Ambiguous request"), (action, obs)
        if terminated:
            break
        assert info["expert_plan"] == gold[played:], "the expert plan is the rest of the gold sequence"
    assert terminated and not truncated
    assert info["won"] and info["score"] == 100.0
    assert total == pytest.approx(1.0)
    assert info["admissible_actions"] == []
    with pytest.raises(EnvError, match="after the episode ended"):
        env.step("look around")


def test_rewards_count_from_the_opening_score(env):
    # find-living-thing starts at 8: one of its subgoals already holds after the opening look
    _, info = env.reset(seed=FIND_LIVING_THING)
    start, total = info["score"], 0.0
    assert start > 0
    for action in info["expert_plan"]:
        _, reward, terminated, _, info = env.step(action)
        total += reward
    assert terminated and info["won"]
    assert total == pytest.approx((100 - start) / 100)


def test_invalid_actions_are_flagged(env):
    _, info = env.reset(seed=BOIL)
    plan = info["expert_plan"]
    for bad in ("xyzzy plugh", "", "focus on", "look around.", "1", "é\x00", "take the moon " * 40):
        obs, reward, terminated, truncated, info = env.step(bad)
        assert obs == "No known action matches that input."
        assert info["action_valid"] is False and reward == 0 and not terminated and not truncated
        assert info["expert_plan"] == plan, "a rejected input changes nothing, so the plan still holds"
    _, _, _, _, info = env.step("LOOK   around")
    assert info["action_valid"] is True
    _, _, _, _, info = env.step("inventory")
    assert info["action_valid"] is True and info["expert_plan"] == [], "an action off the gold path drops the plan"


def test_ambiguity_prompt_never_eats_the_next_action(env):
    # boil, train variation 0: the art studio holds three wood cups, so "pick up wood cup" is ambiguous
    env.reset(seed=BOIL)
    env.step("teleport to art studio")
    obs, reward, terminated, _, info = env.step("pick up wood cup")
    assert obs.startswith("Ambiguous request: 'pick up wood cup' could mean several things:")
    assert "\n0: pick up wood cup (in art studio)\n1: " in obs and "\n2: " in obs
    assert info["action_valid"] is False and reward == 0 and not terminated
    assert info["admissible_actions"][:3] == ["0", "1", "2"]
    # another command cancels the question and runs as itself (raw ScienceWorld would eat it)
    obs, _, _, _, info = env.step("look around")
    assert obs.startswith("This room is called the art studio.") and info["action_valid"]
    obs, _, _, _, info = env.step("inventory")
    assert "wood cup" not in obs, "the cancelled pick-up did not happen"
    # a number answers the question
    env.step("pick up wood cup")
    obs, _, _, _, info = env.step("1")
    assert obs == "You move the wood cup to the inventory." and info["action_valid"]
    assert "a wood cup" in env.step("inventory")[0]
    # an open question does not survive a reset
    env.step("pick up wood cup")
    env.reset(seed=BOIL)
    obs, _, _, _, info = env.step("look around")
    assert obs.startswith("This room is called") and info["action_valid"]


def test_negative_score_ends_the_episode_lost(env):
    env.reset(seed=BOIL)
    obs, reward, terminated, truncated, info = env.step("focus on agent")  # the task is to focus on water
    assert info["score"] == -100.0 and reward == -1.0
    assert terminated and not truncated and info["won"] is False


def test_step_limit_truncates(env):
    env.step_limit = 5
    try:
        env.reset(seed=LIFESPAN_LONGEST)
        _, _, terminated, truncated, _ = env.step("look around")
        assert not truncated
        _, _, terminated, truncated, _ = env.step("wait")  # ten moves of ScienceWorld's clock
        assert truncated and not terminated
    finally:
        env.step_limit = None


def test_heap_cap_reaches_the_jvm_only(env):
    environ = Path(f"/proc/{env.jvm_pid}/environ").read_bytes().split(b"\0")
    assert b"JAVA_TOOL_OPTIONS=-Xmx400m -XX:+UseSerialGC -XX:+ExitOnOutOfMemoryError" in environ
    assert b"scienceworld.jar" in Path(f"/proc/{env.jvm_pid}/cmdline").read_bytes()
    assert "-Xmx400m" not in os.environ.get("JAVA_TOOL_OPTIONS", ""), "the parent's environment is restored"
    env.reset(seed=GROW_PLANT)
    assert _rss_mb(env.jvm_pid) < 700, "Java's default heap lets one JVM reach 0.7-1.3 GB"


def test_java_options_keep_the_users_and_are_restored(monkeypatch):
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-Dmine=1")
    with _child_java_options(["-Xmx200m"]):
        assert os.environ["JAVA_TOOL_OPTIONS"] == "-Dmine=1 -Xmx200m"
    assert os.environ["JAVA_TOOL_OPTIONS"] == "-Dmine=1"
    monkeypatch.delenv("JAVA_TOOL_OPTIONS")
    with _child_java_options(["-Xmx200m"]):
        assert os.environ["JAVA_TOOL_OPTIONS"] == "-Xmx200m"
    assert "JAVA_TOOL_OPTIONS" not in os.environ


def test_splits_are_disjoint_and_close_ends_the_jvm(env):
    dev = ScienceWorldEnv(split="eval", tasks="find-plant, 1-1", admissible=False)  # a task id works too
    try:
        assert dev.split == "dev" and dev.tasks == ["boil", "find-plant"]
        dev_pairs = {dev.task_for_seed(s) for s in range(dev.num_tasks)}
        train_pairs = {env.task_for_seed(s) for s in range(env.num_tasks)}
        assert {task for task, _ in dev_pairs} == {"boil", "find-plant"}
        assert not dev_pairs & train_pairs
        obs, info = dev.reset(seed=0)
        assert info["task_name"] == "boil" and info["admissible_actions"] is None
        _, _, _, _, info = dev.step(info["expert_plan"][0])
        assert info["admissible_actions"] is None and info["action_valid"]
        pid = dev.jvm_pid
        assert pid in _java_children()
    finally:
        dev.close()
    assert pid not in _java_children(), "close() ends the JVM"
    with pytest.raises(EnvError, match="closed"):
        dev.reset(seed=0)


def test_killed_jvm_raises_promptly():
    env = ScienceWorldEnv(tasks=["find-plant"], java_heap_mb=256, admissible=False)
    try:
        env.reset(seed=0)
        assert b"-Xmx256m" in Path(f"/proc/{env.jvm_pid}/environ").read_bytes()
        os.kill(env.jvm_pid, signal.SIGKILL)
        time.sleep(0.2)
        start = time.perf_counter()
        with pytest.raises(EnvError, match=r"JVM \(pid \d+\) has exited \(killed by signal SIGKILL\)"):
            env.step("look around")
        with pytest.raises(EnvError, match="has exited"):
            env.reset(seed=0)
        assert time.perf_counter() - start < 2
    finally:
        env.close()  # a dead JVM closes without raising


def _reset_in_fresh_process(kwargs: dict, seed: int) -> tuple:
    env = ScienceWorldEnv(**kwargs)
    try:
        return env.reset(seed=seed)
    finally:
        env.close()


def test_builds_in_a_spawned_process_from_keyword_arguments():
    kwargs = {"split": "test", "tasks": "find-plant", "admissible": False, "java_heap_mb": 256}
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        obs, info = pool.submit(_reset_in_fresh_process, kwargs, 3).result(timeout=120)
    assert obs.startswith("This room is called") and info["task_name"] == "find-plant"
    assert info["expert_plan"]


def test_bad_arguments_are_clear(monkeypatch):
    with pytest.raises(ConfigError, match=r"Unknown ScienceWorld task 'boill'\. Did you mean 'boil'"):
        ScienceWorldEnv(tasks="boill")
    with pytest.raises(ConfigError, match=r"split must be one of .*got 'valid'\. Did you mean 'eval'"):
        ScienceWorldEnv(split="valid")
    with pytest.raises(ConfigError, match=r"Unknown ScienceWorld simplification 'opendoors'\. Did you mean 'openDoors'"):
        ScienceWorldEnv(simplifications="teleportAction,opendoors")
    with pytest.raises(ConfigError, match="'noElectricalAction' removes the 'connect' actions that power-component"):
        ScienceWorldEnv(tasks="power-component,boil", simplifications="noElectricalAction")
    with pytest.raises(ConfigError, match="java_heap_mb must be an integer of at least 128"):
        ScienceWorldEnv(java_heap_mb=64)
    with pytest.raises(ConfigError, match="step_limit must be a positive integer"):
        ScienceWorldEnv(step_limit=0)
    with pytest.raises(ConfigError, match="tasks is empty"):
        ScienceWorldEnv(tasks=" , ")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(MissingDependencyError, match="apt-get install -y openjdk-17-jre-headless"):
        ScienceWorldEnv(tasks="boil")
