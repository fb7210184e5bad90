"""Environment worker processes: a real environment (vaults) in the pool, crashes and hangs survived."""

from __future__ import annotations

import functools
import os
import signal
import time

import pytest
from agentkit.envs import ActionParser, make
from agentkit.rollout import Collector, EpisodeSpec, SamplingParams
from agentkit.rollout.workers import InProcessEnvs, WorkerPool
from helpers import CountingResets, KillingBackend, SlowToStart, drain, faulty

from agentkit.core.jsonl import TrajectoryWriter, read_trajectories


@pytest.mark.parametrize("fault", ["die", "hang", "raise"])
def test_pool_survives_a_fault_and_restarts(fault):
    pool = WorkerPool(functools.partial(faulty, fault), num_workers=2, step_timeout_s=3.0)
    try:
        for slot in range(2):
            pool.submit(slot, "reset", slot)
        assert [r.value[0] for r in drain(pool, 2)] == ["room 0", "room 1"]
        for _ in range(2):
            for slot in range(2):
                pool.submit(slot, "step", "wait")
            results = drain(pool, 2)
        # the second step faults on both slots; each ends with the error, nothing hangs the caller
        assert all(r.error for r in results), results
        expected = {"die": "worker process died", "hang": "did not answer within 3 s", "raise": "broken simulator"}[fault]
        assert all(expected in r.error for r in results)
        # the workers came back: a new episode plays on the same slots
        for slot in range(2):
            pool.submit(slot, "reset", 10 + slot)
        assert [r.value[0] for r in drain(pool, 2)] == ["room 10", "room 11"]
        if fault != "raise":
            assert pool.restarts == 2
    finally:
        pool.close()


def test_a_request_waits_for_its_worker_to_start_before_its_timeout_runs():
    # the worker takes 3 s to start, the reset may take 1 s: the reset's time counts from when it is up
    pool = WorkerPool(SlowToStart(3.0), num_workers=1, reset_timeout_s=1.0, step_timeout_s=1.0, start_timeout_s=30.0)
    try:
        pool.submit(0, "reset", 5)
        (result,) = drain(pool, 1)
        assert result.error is None and result.value[0] == "room 5"
        assert pool.restarts == 0
    finally:
        pool.close()


def test_a_worker_that_does_not_start_in_time_is_replaced_and_its_request_fails():
    pool = WorkerPool(SlowToStart(60.0), num_workers=1, reset_timeout_s=2.0)  # a start may take as long as a reset
    try:
        started = time.perf_counter()
        pool.submit(0, "reset", 5)
        (result,) = drain(pool, 1, timeout=30)
        assert "its worker process did not start within 2 s" in result.error
        assert time.perf_counter() - started < 20 and pool.restarts == 1
    finally:
        pool.close()


def test_killing_a_worker_ends_its_episodes_and_the_rollout_goes_on(backend, tmp_path):
    # the lamp lasts 6 moves: an episode the kill spares plays all 6 turns
    make_env = functools.partial(make, "vaults/vaults-v0", max_turns=6, action_parser=ActionParser(require_match=False))
    pool = WorkerPool(make_env, num_workers=2, step_timeout_s=30)

    def progress(trajectory, stats):
        pass

    killing = KillingBackend(backend, pool.pids)
    collector = Collector(killing, pool, env_id="vaults/vaults-v0",
                          sampling=SamplingParams(max_new_tokens=8), max_in_flight=4)
    out = tmp_path / "t.jsonl"
    with TrajectoryWriter(out) as writer:
        stats = collector.run([EpisodeSpec(s) for s in range(6)], writer.write, progress=progress)
    collector.close()
    trajectories = read_trajectories(out, strict=True)
    assert stats.episodes == 6 and len(trajectories) == 6, "every episode is written, the crashed ones too"
    crashed = [t for t in trajectories if t.error]
    assert crashed and all("worker process died" in t.error and t.truncated for t in crashed)
    assert len(crashed) < 6 and any(len(t.turns) == 6 for t in trajectories), "the run went on"
    assert pool.restarts == 1


@pytest.mark.parametrize("workers", [1, 2])
def test_worker_rollout_equals_in_process_rollout(backend, workers):
    """Per-episode sampling seeds make a rollout independent of how episodes were batched."""
    make_env = functools.partial(make, "vaults/vaults-v0", max_turns=3, action_parser=ActionParser(require_match=False))
    specs = [EpisodeSpec(s, k) for s in range(3) for k in range(2)]
    params = SamplingParams(max_new_tokens=8, seed=5)
    runs = []
    for envs in (InProcessEnvs(make_env), WorkerPool(make_env, workers)):
        collector = Collector(backend, envs, env_id="vaults/vaults-v0", sampling=params, max_in_flight=4,
                              batch_wait_s=0.0)
        written = []
        collector.run(specs, written.append)
        collector.close()
        runs.append({t.id: ([turn.response_ids for turn in t.turns], [turn.feedback for turn in t.turns]) for t in written})
    assert runs[0] == runs[1]


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the processes whose parent is ``pid`` (read from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            found.append((int(entry), cmdline))
    return found


@pytest.mark.java
def test_killing_the_jvm_ends_the_episode_and_the_worker_recovers():
    pytest.importorskip("scienceworld")
    import shutil

    if shutil.which("java") is None:
        pytest.skip("needs Java (apt-get install -y openjdk-17-jre-headless)")
    make_env = functools.partial(make, "scienceworld/scienceworld-v0", tasks="boil", admissible=False)
    pool = WorkerPool(make_env, num_workers=1, step_timeout_s=60)
    try:
        pool.submit(0, "reset", 0)
        (first,) = drain(pool, 1, timeout=120)
        assert first.error is None
        jvms = [pid for pid, cmd in _children(pool.pids()[0]) if "java" in cmd]
        assert len(jvms) == 1, _children(pool.pids()[0])
        os.kill(jvms[0], signal.SIGKILL)
        time.sleep(0.5)
        pool.submit(0, "step", "look around")
        (broken,) = drain(pool, 1, timeout=30)
        assert broken.error and "JVM" in broken.error  # the episode ends with the error recorded
        pool.submit(0, "reset", 1)  # the next episode gets a fresh environment and JVM
        (again,) = drain(pool, 1, timeout=120)
        assert again.error is None and "boil" in again.value[1]["task"].lower()
    finally:
        pool.close()


def _vaults(max_turns: int = 3):
    return make("vaults/vaults-v0", max_turns=max_turns, action_parser=ActionParser(require_match=False))


def test_a_reset_started_ahead_is_taken_once_and_any_other_request_drops_it():
    """``reset_ahead`` in worker processes: the early reset's result answers the matching request,
    nothing else changes."""
    envs = WorkerPool(CountingResets, 2)
    fresh = InProcessEnvs(_vaults)
    try:
        envs.reset_ahead(0, 5)
        envs.reset_ahead(1, 6)
        envs.reset_ahead(2, 8)
        time.sleep(0.5)
        assert envs.poll(timeout=0.5) == []  # done, but not asked for: held
        envs.submit(0, "reset", 5)  # taken
        envs.submit(1, "reset", 7)  # another seed: the early reset of 6 is dropped
        envs.submit(2, "step", "go back")  # not a reset: waits for the early one, then steps after it
        results = drain(envs, 3)
        for seed in (5, 7, 8):
            fresh.submit(seed, "reset", seed)
        want = {r.slot: r.value for r in fresh.poll(None)}
        assert [r.op for r in results] == ["reset", "reset", "step"]
        # slot 0 reset once (its early reset), slot 1 twice (the dropped early reset, then the asked-for one)
        assert results[0].value == (want[5][0] + " [reset 1]", want[5][1])
        assert results[1].value == (want[7][0] + " [reset 2]", want[7][1])
        assert "dead end" in results[2].value[0] or "Nothing happens" in results[2].value[0]
        envs.submit(0, "step", "go back")  # slot 0 plays on from the reset it was handed
        assert drain(envs, 1)[0].op == "step"
        assert envs.poll(timeout=0.5) == []  # nothing left over: every reset ran once
    finally:
        envs.close()
        fresh.close()


def test_in_process_environments_reset_when_asked_not_ahead():
    """A reset run early in this process would compete with the training step for the interpreter:
    ``reset_ahead`` leaves it to the request."""
    envs = InProcessEnvs(CountingResets)
    try:
        envs.reset_ahead(0, 5)
        assert envs.poll(timeout=0) == []
        envs.submit(0, "reset", 6)  # another seed: nothing ran early that has to be dropped
        (result,) = envs.poll(None)
        assert result.value[0].endswith("[reset 1]")
    finally:
        envs.close()


@pytest.mark.parametrize("runner", ["in-process", "workers"])
def test_a_collector_plays_the_same_episodes_with_resets_started_ahead(backend, runner):
    """What the training loop does: the next step's resets start before it runs; its episodes are unchanged."""
    params = SamplingParams(max_new_tokens=8, seed=5)
    steps = [[EpisodeSpec(s, k) for s in range(3 * i, 3 * i + 3) for k in range(2)] for i in range(2)]
    runs = []
    for ahead in (False, True):
        envs = InProcessEnvs(_vaults) if runner == "in-process" else WorkerPool(_vaults, 2)
        collector = Collector(backend, envs, env_id="vaults/vaults-v0", sampling=params, max_in_flight=4,
                              batch_wait_s=0.0)
        written = []
        collector.run(steps[0], written.append)
        if ahead:
            collector.reset_ahead(steps[1])
        collector.run(steps[1], written.append)
        collector.close()
        runs.append({t.id: ([turn.response_ids for turn in t.turns], [turn.feedback for turn in t.turns], t.task)
                     for t in written})
    assert len(runs[0]) == 12 and runs[0] == runs[1]
