"""Environment workers as Ray actors, on a real Ray cluster started here with `ray start --head`.

The cluster is private to this module: its own port, loopback address and temp dir, and at the end
only its own processes are stopped (``ray stop`` would stop every Ray cluster on the machine).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

ray = pytest.importorskip("ray")

import helpers  # noqa: E402
from agentkit.envs import ActionParser, make  # noqa: E402
from agentkit.rollout import Collector, EpisodeSpec, SamplingParams  # noqa: E402
from agentkit.rollout.ray_workers import RayEnvs, connect, import_ray  # noqa: E402
from agentkit.rollout.runners import make_env_runner  # noqa: E402
from agentkit.rollout.workers import InProcessEnvs  # noqa: E402
from helpers import KillingBackend, drain, faulty  # noqa: E402

from agentkit.core.errors import ConfigError, MissingDependencyError  # noqa: E402
from agentkit.core.jsonl import TrajectoryWriter, read_trajectories  # noqa: E402

ENV = "textworld/coin-v0"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes_of(temp_dir: str) -> list[int]:
    """The cluster's processes: those naming its temp dir on their command line, and their descendants
    (actor processes rename themselves, ``ray::_EnvActor``, so they are found through their raylet)."""
    parents, found = {}, set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            if state == "Z":  # exited, waiting to be reaped: nothing left to stop
                continue
            parents[int(entry)] = int(ppid)
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if temp_dir.encode() in f.read():
                    found.add(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    grew = True
    while grew:
        children = {pid for pid, ppid in parents.items() if ppid in found} - found
        found |= children
        grew = bool(children)
    return sorted(found - {os.getpid()})


def _stop_cluster(temp_dir: str) -> None:
    for sig, grace in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):  # gcs and raylet take long to heed SIGTERM
        pids = _processes_of(temp_dir)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + grace
        while pids and time.time() < deadline:
            time.sleep(0.2)
            pids = _processes_of(temp_dir)
        if not pids:
            return


@pytest.fixture(scope="module")
def cluster_env(agentkit_cache) -> dict[str, str]:
    """Environment for the cluster and for CLI runs; actors see the cluster's, not the driver's.

    Token authentication is off: with it on, Ray reads (and a new local cluster writes) the user's
    ~/.ray/auth_token, and a driver joining by address needs RAY_AUTH_MODE=token.
    """
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
            "AGENTKIT_CACHE": str(agentkit_cache), "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def ray_cluster(cluster_env):
    """A 2-CPU Ray head on 127.0.0.1 with its own port and temp dir; this process joins it as a driver."""
    temp_dir = tempfile.mkdtemp(prefix="akray-")  # short: Ray's socket paths live under it
    address = f"127.0.0.1:{_free_port()}"
    ray_cli = [sys.executable, "-m", "ray.scripts.scripts"]  # `ray`, run by this Python
    started = subprocess.run(
        [*ray_cli, "start", "--head", "--num-cpus", "2", "--port", address.split(":")[1], "--node-ip-address", "127.0.0.1",
         "--temp-dir", temp_dir, "--include-dashboard", "false", "--disable-usage-stats"],
        env=cluster_env, capture_output=True, text=True, timeout=180)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        connect(address)  # fails in seconds if the head is not there (ray.init would retry for minutes)
        ray.cloudpickle.register_pickle_by_value(helpers)  # its fault-injecting envs, for the actors
        try:
            yield address
        finally:
            ray.cloudpickle.unregister_pickle_by_value(helpers)
    finally:
        ray.shutdown()
        _stop_cluster(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def textworld_env(max_turns: int):
    pytest.importorskip("textworld")
    return functools.partial(make, ENV, max_turns=max_turns, action_parser=ActionParser(require_match=False), level=2)


@pytest.mark.parametrize("fault", ["die", "hang", "raise"])
def test_actors_survive_a_fault_and_restart(ray_cluster, fault):
    envs = RayEnvs(functools.partial(faulty, fault), 2, address=ray_cluster, step_timeout_s=3.0)
    try:
        first_pids = envs.pids()
        for slot in range(2):
            envs.submit(slot, "reset", slot)
        assert [r.value[0] for r in drain(envs, 2)] == ["room 0", "room 1"]
        for _ in range(2):
            for slot in range(2):
                envs.submit(slot, "step", "wait")
            started = time.time()
            results = drain(envs, 2)
        # the second step faults on both slots; each ends with the error, nothing hangs the caller
        expected = {"die": "Ray actor died (its worker process has died)", "hang": "did not answer within 3 s",
                    "raise": "ValueError: broken simulator"}[fault]
        assert all(r.error and expected in r.error and r.value is None for r in results), results
        assert time.time() - started < 20
        if fault != "raise":  # a step on a slot whose environment went down with its actor says so
            envs.submit(0, "step", "wait")
            (lost,) = drain(envs, 1)
            assert "its Ray actor died and was restarted, so this environment was lost" in lost.error
        # the actors came back: a new episode plays on the same slots
        for slot in range(2):
            envs.submit(slot, "reset", 10 + slot)
        assert [r.value[0] for r in drain(envs, 2)] == ["room 10", "room 11"]
        assert envs.restarts == (0 if fault == "raise" else 2) and envs.pending == 0
        assert (envs.pids() == first_pids) == (fault == "raise")
    finally:
        envs.close()


def test_more_actors_than_cpus_share_them_and_unplaceable_actors_fail_at_start(ray_cluster):
    envs = RayEnvs(functools.partial(faulty, "none"), 4, address=ray_cluster)  # a 2-CPU laptop, --env-workers 4
    try:
        assert envs.num_cpus == 0.5 and len(set(envs.pids())) == 4
        for slot in range(8):
            envs.submit(slot, "reset", slot)
        assert [r.value[0] for r in drain(envs, 8)] == [f"room {slot}" for slot in range(8)]
    finally:
        envs.close()
    with pytest.raises(ConfigError, match=r"2 of 2 environment actors \(3 CPU each\) were not started within 2 s; "
                                          r"the cluster has 2 CPUs"):
        RayEnvs(functools.partial(faulty, "none"), 2, address=ray_cluster, num_cpus=3, start_timeout_s=2)


def test_an_env_the_actors_cannot_import_fails_at_start(ray_cluster):
    """The usual multi-node mistake (a node without the env's package) is reported before any episode."""
    ray.cloudpickle.unregister_pickle_by_value(helpers)  # helpers is not importable on the cluster
    try:
        with pytest.raises(ConfigError, match=r"(?s)environment actor failed to start.*No module named 'helpers'"
                                              r".*installed in the Python of every Ray node"):
            RayEnvs(functools.partial(faulty, "none"), 2, address=ray_cluster)
    finally:
        ray.cloudpickle.register_pickle_by_value(helpers)


def test_ray_rollout_equals_in_process_rollout(backend, ray_cluster):
    """Per-episode sampling seeds make a rollout independent of where its environments ran."""
    make_env = textworld_env(max_turns=3)
    specs = [EpisodeSpec(s, k) for s in range(3) for k in range(2)]
    params = SamplingParams(max_new_tokens=8, seed=5)
    runs = []
    for envs in (InProcessEnvs(make_env), make_env_runner(make_env, 2, ray=ray_cluster)):
        collector = Collector(backend, envs, env_id=ENV, sampling=params, max_in_flight=4, batch_wait_s=0.0)
        written = []
        try:
            collector.run(specs, written.append)
            if isinstance(envs, RayEnvs):
                assert len(set(envs.pids())) == 2 and envs.restarts == 0
        finally:
            collector.close()
        assert not any(t.error for t in written), [t.error for t in written]
        runs.append({t.id: ([turn.response_ids for turn in t.turns], [turn.feedback for turn in t.turns]) for t in written})
    assert len(runs[0]) == 6 and runs[0] == runs[1]


def test_killing_an_actor_ends_its_episodes_and_the_rollout_goes_on(backend, ray_cluster, tmp_path):
    envs = RayEnvs(textworld_env(max_turns=6), 2, address=ray_cluster, step_timeout_s=60)
    killing = KillingBackend(backend, envs.pids)
    collector = Collector(killing, envs, env_id=ENV, sampling=SamplingParams(max_new_tokens=8),
                          max_in_flight=4)
    out = tmp_path / "t.jsonl"
    try:
        with TrajectoryWriter(out) as writer:
            stats = collector.run([EpisodeSpec(s) for s in range(6)], writer.write)
        assert envs.pids()[0] != killing.killed[0], "actor 0 was replaced"
    finally:
        collector.close()
    trajectories = read_trajectories(out, strict=True)
    assert stats.episodes == 6 and len(trajectories) == 6, "every episode is written, the crashed ones too"
    crashed = [t for t in trajectories if t.error]
    assert crashed and all("Ray actor died" in t.error and t.truncated for t in crashed), [t.error for t in crashed]
    assert len(crashed) <= 2, "only the episodes on actor 0 (slots 0 and 2) were lost"
    assert len(crashed) < 6 and any(len(t.turns) == 6 for t in trajectories), "the run went on"
    assert envs.restarts == 1


def _cli(args: list[str], env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentkit.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_cli_rollout_on_a_ray_cluster(ray_cluster, cluster_env, tiny_model_dir, tmp_path):
    pytest.importorskip("textworld")
    out = tmp_path / "ray.jsonl"
    done = _cli(["rollout", "--ray", ray_cluster, "--env-workers", "2", "--env", ENV, "--env-kwargs", "level=2",
                 "--episodes", "3", "--group-size", "2", "--max-turns", "3", "--max-new-tokens", "8",
                 "--model", str(tiny_model_dir), "--out", str(out), "--quiet"], cluster_env)
    assert done.returncode == 0, done.stderr[-3000:]
    trajectories = read_trajectories(out, strict=True)
    assert len(trajectories) == 6 and not any(t.error for t in trajectories)
    assert sorted((t.seed, t.sample) for t in trajectories) == [(s, k) for s in range(3) for k in range(2)]
    assert "wrote 6 trajectories" in done.stdout
    # the environments ran on the cluster: two actors of another job (the CLI's), now gone with it
    ours = ray.get_runtime_context().get_job_id()
    actors = [a for a in ray._private.state.actors().values() if a["ActorClassName"].endswith("_EnvActor")]
    theirs = [a for a in actors if a["JobID"] != ours]
    assert len(theirs) == 2 and all(a["State"] == "DEAD" for a in theirs), json.dumps(theirs, default=str)[:2000]


@pytest.mark.slow  # 25-45 s here
def test_train_with_ray_env_workers_equals_in_process(ray_cluster, cluster_env, tiny_model_dir, tmp_path):
    """`agentkit train` with env.ray: the same rollouts, hence the same step, as environments in process."""
    pytest.importorskip("textworld")
    base = ["train", "--objective", "grpo", "--env", ENV, "--model", str(tiny_model_dir), "--steps", "1",
            "--group-size", "2", "--tasks-per-step", "2", "--quiet", "--set", "env.kwargs={level: 2}",
            "--set", "eval.episodes=2", "--set", "env.max_turns=3", "--set", "sampling.max_new_tokens=8"]
    runs = {}
    # training runs two pools (train and eval split) of env.workers actors each: 2 on the 2-CPU cluster
    for name, extra in (("ray", ["--set", f"env.ray={ray_cluster}", "--set", "env.workers=1"]), ("local", [])):
        done = _cli([*base, "--out", str(tmp_path / name), *extra], cluster_env, timeout=400)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[0])
    for key in ("return_mean", "success_rate", "tokens", "loss", "invalid_rate"):
        assert runs["ray"][key] == runs["local"][key], key


def test_cli_refuses_an_address_nothing_listens_at(cluster_env, tiny_model_dir, tmp_path):
    out = tmp_path / "never.jsonl"
    address = f"127.0.0.1:{_free_port()}"
    started = time.time()
    done = _cli(["rollout", "--ray", address, "--env-workers", "2", "--model", str(tiny_model_dir), "--out", str(out),
                 "--quiet"], cluster_env)
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"Ray address '{address}' (--ray): nothing answers at {address}" in done.stderr
    assert "ray start --head" in done.stderr
    assert not out.exists(), "the output file is not touched"
    assert time.time() - started < 60


def test_settings_errors(monkeypatch):
    from agentkit.rollout.config import RolloutConfig

    from agentkit.core.config import validate_settings

    with pytest.raises(ConfigError, match=r"env.ray \(--ray\) runs the environments in Ray actors, but env.workers "
                                          r"\(--env-workers\) is 0"):
        validate_settings(RolloutConfig, {"env": {"ray": "auto", "workers": 0}})
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # the check runs before ray.init
    with pytest.raises(ConfigError, match=r"expected auto, local, HOST:PORT"):
        connect("my-cluster")
    monkeypatch.setitem(sys.modules, "ray", None)  # Ray not installed
    with pytest.raises(MissingDependencyError, match=r"pip install 'agentkit\[ray\]'"):
        import_ray()


@pytest.mark.slow
def test_cli_rollout_on_a_local_cluster(cluster_env, tiny_model_dir, tmp_path):
    """--ray local starts a cluster inside the CLI's process and stops it on exit."""
    pytest.importorskip("textworld")
    out = tmp_path / "local.jsonl"
    done = _cli(["rollout", "--ray", "local", "--env-workers", "2", "--env", ENV, "--env-kwargs", "level=2", "--episodes", "2",
                 "--max-turns", "2", "--max-new-tokens", "8", "--model", str(tiny_model_dir), "--out", str(out),
                 "--quiet"], cluster_env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(read_trajectories(out, strict=True)) == 2
