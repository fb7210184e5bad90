"""What environments and disks do to a run never crashes it, corrupts a file or leaves processes behind.

- A CLI process killed with ``kill -9`` while its environments hang takes its worker processes with
  it (the kernel's parent-death signal, and a watchdog in each worker for what that cannot cover).
- A reset that hangs ends its episode after ``env.reset_timeout`` (``--reset-timeout``), as a hung
  step does after ``env.step_timeout``, and the run goes on.
- A full disk ends a rollout or a training run with one line (the file, the space left there, the
  command that goes on) and exit code 2; every line already written stays whole, and ``--resume``
  completes the work once there is space. The disk is a real one: a tiny tmpfs (mounting it needs
  root, as in CI; the tests are skipped elsewhere), whose size is raised to give the space back.

``StallingEnv`` is a real environment plugin loaded by import path, in this process and in worker
processes (the subprocesses get this folder on PYTHONPATH).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agentkit.envs import ACTION_TAG, EnvSpec
from agentkit.rollout.workers import PARENT_POLL_S, WorkerPool

from agentkit.core.errors import DiskFullError
from agentkit.core.jsonl import TrajectoryWriter, read_trajectories
from agentkit.core.settings import EnvSettings

TESTS = str(Path(__file__).parent)
INFO = {"admissible_actions": None, "action_valid": True, "won": False, "score": 0.0, "privileged": None}
PR_GET_PDEATHSIG = 2
LINUX = sys.platform.startswith("linux")


def parent_death_signal() -> int:
    """This process's parent-death signal (0: none), as the kernel has it."""
    value = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(PR_GET_PDEATHSIG, ctypes.byref(value), 0, 0, 0)
    return value.value


class StallingEnv:
    """Two-turn tasks. ``stall`` ("reset" or "step") makes that call sleep for an hour, on seed
    ``stall_seed`` only (-1: every seed); before it sleeps, the process writes ``PID.hanging``
    (holding its parent-death signal, on Linux) into ``pid_dir``. ``words``: how long the first
    observation is, to make big trajectory lines."""

    def __init__(self, stall: str = "none", stall_seed: int = -1, pid_dir: str = "", words: int = 0,
                 split: str = "train") -> None:
        self.stall, self.stall_seed, self.pid_dir, self.words = stall, stall_seed, pid_dir, words
        self.seed, self.turn = 0, 0

    def _maybe_stall(self, where: str) -> None:
        if self.stall != where or self.stall_seed not in (-1, self.seed):
            return
        if self.pid_dir:
            signal_number = parent_death_signal() if LINUX else 0
            Path(self.pid_dir, f"{os.getpid()}.hanging").write_text(str(signal_number))
        time.sleep(3600)

    def reset(self, *, seed=None, options=None):
        self.seed, self.turn = seed or 0, 0
        self._maybe_stall("reset")
        text = " ".join(f"room{(self.seed * 7 + i) % 97}" for i in range(self.words))
        return f"Task {seed}: say anything. {text}", {**INFO, "task": f"task {seed}"}

    def step(self, action: str):
        self.turn += 1
        self._maybe_stall("step")
        done = self.turn >= 2
        return "Fine.", 0.5, done, False, {**INFO, "task": f"task {self.seed}", "won": done, "score": 1.0}

    def close(self) -> None:
        pass


STALLING_SPEC = EnvSpec(StallingEnv, action_format=dataclasses.replace(ACTION_TAG, parser=None))
ENV_ID = f"{StallingEnv.__module__}:STALLING_SPEC"


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "agentkit.cli", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": TESTS}


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (an exited process waiting to be reaped does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _hanging(pid_dir: Path, count: int, process: subprocess.Popen, log: Path, timeout: float = 120) -> dict[int, int]:
    """Wait until ``count`` workers hang; {worker pid: its parent-death signal}. ``log``: the
    process's output (a file: a pipe would stay open as long as a worker that inherited it lives)."""
    deadline = time.time() + timeout
    while len(found := list(pid_dir.glob("*.hanging"))) < count:
        assert process.poll() is None, f"it ended before {count} workers hung: {log.read_text()[-3000:]}"
        assert time.time() < deadline, f"only {len(found)} of {count} workers hung within {timeout} s"
        time.sleep(0.2)
    time.sleep(0.2)  # the files are written whole
    return {int(path.stem): int(path.read_text()) for path in found}


def _gone_within(pids, seconds: float) -> list[int]:
    """The pids still running after ``seconds`` (every one is SIGKILLed afterwards, so none leaks)."""
    deadline = time.time() + seconds
    while (left := [pid for pid in pids if _alive(pid)]) and time.time() < deadline:
        time.sleep(0.1)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return left


@pytest.fixture
def pid_dir(tmp_path):
    """Where hanging workers write their pids; whichever still runs at the end is killed, so a
    failing test leaves no process behind."""
    path = tmp_path / "pids"
    path.mkdir()
    yield path
    _gone_within([int(p.stem) for p in path.glob("*.hanging")], 0)


# -- 7. workers die with their parent -------------------------------------------------------------
@pytest.mark.skipif(not LINUX, reason="reads processes from /proc")
def test_kill_9_of_the_cli_takes_its_hanging_env_workers_with_it(tiny_model_dir, tmp_path, pid_dir):
    log = tmp_path / "log"
    with log.open("w") as output:
        cli = subprocess.Popen(
            _cli("rollout", "--model", str(tiny_model_dir), "--env", ENV_ID, "--env-kwargs", "stall=step",
                 f"pid_dir={pid_dir}", "--env-workers", "2", "--episodes", "2", "--max-new-tokens", "4",
                 "--out", str(tmp_path / "t.jsonl"), "--quiet"),
            stdout=output, stderr=subprocess.STDOUT, env=_env())
    workers = {}
    try:
        workers = _hanging(pid_dir, 2, cli, log)
        assert {_parent(pid) for pid in workers} == {cli.pid}, "the hanging environments run in the CLI's workers"
        assert set(workers.values()) == {signal.SIGKILL}, "started from the main thread: the kernel kills them"
        os.kill(cli.pid, signal.SIGKILL)
        cli.wait(timeout=10)
    finally:
        cli.kill()
        cli.wait()
    assert not _gone_within(workers, 5.0), "workers outlived the CLI killed with kill -9"


@pytest.mark.skipif(not LINUX, reason="reads processes from /proc")
def test_workers_started_from_a_thread_outlive_it_and_still_die_with_their_process(tmp_path, pid_dir):
    """The parent-death signal follows the thread that started a worker, so a pool built in a thread
    that ends must not ask for it (its workers would die with the thread); the watchdog still ends
    them when the process is killed."""
    log, answered = tmp_path / "log", tmp_path / "answered"
    script = tmp_path / "owner.py"
    script.write_text(f"""
import functools, sys, threading, time
sys.path.insert(0, {TESTS!r})
from agentkit.envs import make
from agentkit.rollout.workers import WorkerPool

def answer(pool, seed):
    pool.submit(0, "reset", seed)
    results = []
    while not results:
        results = pool.poll(1.0)
    return results[0].error or "reset answered"


def build(pools):
    pool = WorkerPool(functools.partial(make, {ENV_ID!r}, stall="step", pid_dir={str(pid_dir)!r}), num_workers=1)
    answer(pool, 0)  # the worker is up, its parent-death signal (if any) set, before this thread ends
    pools.append(pool)


if __name__ == "__main__":
    pools = []
    builder = threading.Thread(target=build, args=(pools,))
    builder.start()
    builder.join()
    time.sleep(0.5)  # the thread that started the worker has ended
    pool = pools[0]
    print(answer(pool, 1), file=open({str(answered)!r}, "w"), flush=True)
    print(open({str(answered)!r}).read(), flush=True)  # in the log, should the step not hang
    pool.submit(0, "step", "wait")  # hangs
    pool.poll(None)
""")
    with log.open("w") as output:
        owner = subprocess.Popen([sys.executable, str(script)], stdout=output, stderr=subprocess.STDOUT)
    workers = {}
    try:
        workers = _hanging(pid_dir, 1, owner, log, timeout=60)
        assert answered.read_text().strip() == "reset answered", "the worker outlived the thread that started it"
        assert set(workers.values()) == {0}, "a worker started from another thread has no parent-death signal"
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=10)
    finally:
        owner.kill()
        owner.wait()
    assert not _gone_within(workers, 5 * PARENT_POLL_S + 2.0), "the watchdog did not end the orphaned worker"


# -- 8. a hung reset is bounded by env.reset_timeout ----------------------------------------------
@pytest.mark.slow  # 14-30 s here: keeps the default run under 15 minutes
def test_a_hung_reset_ends_its_episode_after_reset_timeout_and_the_run_goes_on(tiny_model_dir, tmp_path):
    out = tmp_path / "t.jsonl"
    started = time.time()
    done = subprocess.run(
        _cli("rollout", "--model", str(tiny_model_dir), "--env", ENV_ID, "--env-kwargs", "stall=reset", "stall_seed=1",
             "--env-workers", "1", "--reset-timeout", "5", "--max-in-flight", "1", "--episodes", "3",
             "--max-new-tokens", "4", "--out", str(out), "--quiet"),
        capture_output=True, text=True, timeout=120, env=_env())  # the old fixed bound was 600 s
    assert done.returncode == 0, done.stderr[-3000:]
    assert time.time() - started < 100
    trajectories = {t.seed: t for t in read_trajectories(out, strict=True)}
    assert sorted(trajectories) == [0, 1, 2]
    hung = trajectories[1]
    assert hung.truncated and not hung.turns
    assert "reset failed: the environment did not answer within 5 s" in hung.error
    assert all(trajectories[seed].error is None and len(trajectories[seed].turns) == 2 for seed in (0, 2)), \
        "the episodes around the hung reset play on"


def test_reset_timeout_reaches_worker_processes_and_ray_actors(monkeypatch):
    from agentkit.rollout import ray_workers
    from agentkit.rollout.run import make_envs

    settings = EnvSettings(id=ENV_ID, workers=1, reset_timeout=7.5, step_timeout=3.5)
    pool = make_envs(settings, "train")
    try:
        assert isinstance(pool, WorkerPool) and (pool.reset_timeout_s, pool.step_timeout_s) == (7.5, 3.5)
    finally:
        pool.close()
    built = {}
    monkeypatch.setattr(ray_workers, "RayEnvs", lambda make_env, workers, **kwargs: built.update(kwargs))
    make_envs(settings.model_copy(update={"ray": "local"}), "train")  # no cluster: only the arguments are checked
    assert (built["reset_timeout_s"], built["step_timeout_s"]) == (7.5, 3.5)


# -- 6. a full disk --------------------------------------------------------------------------------
@contextlib.contextmanager
def small_disk(path: Path, size: str):
    """A tmpfs of ``size`` at ``path`` (a real disk that fills up); skips where mounting is not permitted."""
    path.mkdir()
    if not LINUX or os.geteuid() != 0:
        pytest.skip("a real full disk needs a small tmpfs, and mounting one needs root (CI runs as root)")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def grow(path: Path, size: str) -> None:
    """Give the space back: the same tmpfs, larger."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


def _error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("agentkit: error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


@pytest.mark.slow  # 14-30 s here: keeps the default run under 15 minutes
def test_a_full_disk_ends_a_rollout_in_one_line_and_resume_completes_it(tiny_model_dir, tmp_path):
    disk = tmp_path / "disk"
    out = disk / "t.jsonl"
    with small_disk(disk, "16k"):
        command = _cli("rollout", "--model", str(tiny_model_dir), "--env", ENV_ID, "--env-kwargs", "words=300",
                       "--episodes", "6", "--max-in-flight", "1", "--max-new-tokens", "4", "--out", str(out), "--quiet")
        full = subprocess.run(command, capture_output=True, text=True, timeout=300, env=_env())
        assert full.returncode == 2, full.stderr[-3000:]
        message = _error_line(full.stderr)
        assert f"No space left on device while writing trajectories to {out} (" in message
        assert "free there now)" in message
        written = out.read_bytes()
        assert written.endswith(b"\n"), "whole lines only: the write that failed was undone"
        before = read_trajectories(out, strict=True)
        assert 0 < len(before) < 6, "the disk filled up part way"
        assert f"the {len(before)} trajector{'y' if len(before) == 1 else 'ies'} written before, all intact" in message
        again = message.split("Then complete the rollout with: ", 1)[1]
        assert again.startswith("agentkit rollout ") and again.endswith(f"--out {out} --resume")

        grow(disk, "1m")
        resumed = subprocess.run(_cli(*shlex.split(again)[1:]), capture_output=True, text=True, timeout=300, env=_env())
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        after = out.read_bytes()
        assert after.startswith(written), "the lines written before the disk filled up are untouched"
        trajectories = read_trajectories(out, strict=True)
        assert sorted(t.seed for t in trajectories) == list(range(6))
        assert all(t.error is None for t in trajectories)


def test_a_full_disk_at_a_checkpoint_ends_training_in_one_error_and_resume_goes_on(tiny_model_dir, vaults_demos,
                                                                                   tmp_path):
    from agentkit.train import train
    from agentkit.train.checkpoint import check_complete, checkpoints
    from agentkit.train.config import load_config

    # room for the run's small files and one checkpoint (weights, twice their size of optimizer state,
    # the tokenizer), not two
    model_files = sum(path.stat().st_size for path in tiny_model_dir.iterdir() if path.is_file())
    weights = (tiny_model_dir / "model.safetensors").stat().st_size
    checkpoint_size = model_files + 2 * weights
    disk = tmp_path / "disk"
    run = disk / "run"
    with small_disk(disk, str(int(checkpoint_size * 1.6))):
        cfg = load_config(None, ["env.id=vaults/vaults-v0", "env.kwargs.families=amber", "objective.name=sft",
                                 f"train.demos={vaults_demos}", "train.steps=2", "checkpoint.every=1",
                                 "checkpoint.keep=2", "eval.every=0", "eval.episodes=1", f"model={tiny_model_dir}",
                                 f"out={run}"])
        with pytest.raises(DiskFullError) as raised:
            train(cfg, show_progress=False)
        message = str(raised.value)
        assert "\n" not in message
        assert "No space left on device while writing checkpoint step-2 (" in message and f"to {run}/checkpoints/." in message
        assert "free there now)" in message and "step-1, the last complete checkpoint" in message
        assert message.endswith(f"Then continue the run (from checkpoint step-1) with: agentkit train --out {run} --resume")
        assert checkpoints(run) == [1]
        check_complete(run / "checkpoints" / "step-1")
        assert not (run / "checkpoints" / "step-2").exists(), "a partial checkpoint is never visible as one"
        assert [line.count("\n") for line in (run / "metrics.jsonl").read_text().splitlines(keepends=True)] == [1, 1]

        grow(disk, str(int(checkpoint_size * 4)))
        result = train(load_config(run / "config.yaml"), resume=True, show_progress=False)
        assert checkpoints(run) == [1, 2] and result.checkpoint == run / "checkpoints" / "step-2"
        check_complete(run / "checkpoints" / "step-2")


class _FillingFile:
    """Stands in for the writer's file where no disk can be filled for real (no root): it takes
    ``room`` more bytes, then refuses with ENOSPC, as a full disk does."""

    def __init__(self, real, room: int) -> None:
        self.real, self.room = real, room

    def write(self, data) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        taken = self.real.write(bytes(data[: self.room]))
        self.room -= taken
        return taken

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_a_write_cut_short_by_a_full_disk_is_undone(tmp_path):
    from agentkit.core.trajectory import Trajectory

    path = tmp_path / "t.jsonl"
    record = Trajectory(id="e0", env="stall", task="task 0", seed=0, split="train", group="g0", sample=0, turns=[],
                        episode_return=0.0, won=False, score=0.0, terminated=True, truncated=False, model="m",
                        sampling={})
    writer = TrajectoryWriter(path)
    writer.write(record)
    size = path.stat().st_size
    writer._file = _FillingFile(writer._file, room=size // 2)  # half of the next line fits
    with pytest.raises(DiskFullError, match=rf"while writing trajectories to {path} \(.* free there now\)\. The file "
                                            r"keeps whole lines only: the 1 trajectory written before, all intact"):
        writer.write(dataclasses.replace(record, id="e1", seed=1))
    writer.close()
    assert path.stat().st_size == size
    assert [t.id for t in read_trajectories(path, strict=True)] == ["e0"]
