"""`agentkit rollout --resume`: a rollout killed with SIGKILL, then resumed, equals an uninterrupted one.

The killed run and its resume are the real command in subprocesses; the rest call the CLI's
``main`` in this process (the same code, without a second interpreter start per check).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentkit.core.jsonl import TornLineWarning, read_complete_lines, read_trajectories
from agentkit.core.trajectory import Trajectory

ENV = "vaults/vaults-v0"
SEED, EPISODES, GROUP = 3, 2, 8  # 16 episodes of 2 tasks
EXPECTED_IDS = {f"{ENV}|train|{seed}|{sample}" for seed in range(SEED, SEED + EPISODES) for sample in range(GROUP)}


def command(model: Path, out: Path, *extra: str) -> list[str]:
    """One rollout command; two episodes in flight so a kill lands while most are still to play."""
    return ["rollout", "--env", ENV, "--env-kwargs", "families=meta", "--model", str(model), "--episodes", str(EPISODES),
            "--group-size", str(GROUP), "--seed", str(SEED), "--max-turns", "4", "--max-new-tokens", "8",
            "--env-workers", "0", "--max-in-flight", "2", "--quiet", "--out", str(out), *extra]


def run_cli(args: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentkit.cli", *args], capture_output=True, text=True, timeout=timeout)


def run_in_process(args: list[str], capsys) -> tuple[int, str, str]:
    from agentkit.cli import main

    code = main(args)
    captured = capsys.readouterr()
    return code, " ".join(captured.out.split()), " ".join(captured.err.split())  # undo the console's line wrapping


def content(trajectory: Trajectory) -> tuple[dict, list[list[float]]]:
    """Everything a trajectory records except its timings, with the logprobs apart (compared to a tolerance)."""
    record = trajectory.to_dict()
    record.pop("created_at")
    record["turns"] = [{k: v for k, v in turn.items() if k not in ("generation_s", "env_s", "response_logprobs")}
                       for turn in record["turns"]]
    return json.loads(json.dumps(record)), [turn.response_logprobs for turn in trajectory.turns]


def assert_equals_reference(path: Path, reference: dict[str, Trajectory]) -> None:
    trajectories = read_trajectories(path, strict=True)
    ids = [t.id for t in trajectories]
    assert len(ids) == len(set(ids)), f"duplicates: {sorted(i for i in ids if ids.count(i) > 1)}"
    assert set(ids) == EXPECTED_IDS
    for trajectory in trajectories:
        record, logprobs = content(trajectory)
        expected_record, expected_logprobs = content(reference[trajectory.id])
        assert record == expected_record, trajectory.id
        for got, want in zip(logprobs, expected_logprobs, strict=True):
            assert got == pytest.approx(want, abs=1e-5), trajectory.id


@pytest.fixture(scope="module")
def reference(tiny_model_dir, tmp_path_factory) -> tuple[Path, dict[str, Trajectory]]:
    """The uninterrupted run."""
    from agentkit.cli import main

    out = tmp_path_factory.mktemp("reference") / "whole.jsonl"
    assert main(command(tiny_model_dir, out)) == 0
    trajectories = read_trajectories(out, strict=True)
    assert {t.id for t in trajectories} == EXPECTED_IDS and len(trajectories) == len(EXPECTED_IDS)
    return out, {t.id: t for t in trajectories}


@pytest.mark.slow  # 14-30 s here: keeps the default run under 15 minutes
def test_sigkill_then_resume_completes_without_duplicates(tiny_model_dir, reference, tmp_path):
    out = tmp_path / "killed.jsonl"
    at_least = 3
    proc = subprocess.Popen([sys.executable, "-m", "agentkit.cli", *command(tiny_model_dir, out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while not (out.exists() and out.read_bytes().count(b"\n") >= at_least):
            assert proc.poll() is None, f"the rollout ended before it could be killed: {proc.stderr.read().decode()}"
            assert time.monotonic() < deadline, "no trajectories written within 240 s"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=60)
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL

    killed = out.read_bytes()
    survivors, _ = read_complete_lines(out)  # every complete line validates
    assert at_least <= len(survivors) < len(EXPECTED_IDS), "the kill landed mid-run"
    assert len(read_trajectories(out)) == len(survivors)

    result = run_cli(command(tiny_model_dir, out, "--resume"))
    assert result.returncode == 0, result.stderr
    summary = " ".join(result.stdout.split())
    played = len(EXPECTED_IDS) - len(survivors)
    assert f"{len(survivors)} trajectories were already there, played and appended {played};" in summary, summary
    assert out.read_bytes().startswith(killed[: killed.rfind(b"\n") + 1]), "the lines written before the kill are intact"
    assert_equals_reference(out, reference[1])


def test_torn_last_line_is_set_aside_and_its_episode_replayed(tiny_model_dir, reference, tmp_path, capsys):
    lines = reference[0].read_bytes().splitlines(keepends=True)
    kept, fragment = b"".join(lines[:13]), lines[13][: len(lines[13]) // 2]
    out = tmp_path / "torn.jsonl"
    out.write_bytes(kept + fragment)

    with pytest.warns(TornLineWarning):
        code, summary, stderr = run_in_process(command(tiny_model_dir, out, "--resume"), capsys)
    assert code == 0, stderr
    assert "13 trajectories were already there, played and appended 3;" in summary, summary
    assert f"a torn last line of {len(fragment)} bytes" in summary and "torn.jsonl.torn" in summary
    assert (tmp_path / "torn.jsonl.torn").read_bytes() == fragment + b"\n"
    assert out.read_bytes().startswith(kept)
    assert_equals_reference(out, reference[1])


def test_a_parsable_last_line_without_its_newline_counts_as_torn(reference, tmp_path):
    """The writer sets aside everything after the last newline, so resume must not count it as played."""
    from agentkit.rollout.config import RolloutConfig
    from agentkit.rollout.run import plan_resume

    lines = reference[0].read_bytes().splitlines(keepends=True)
    out = tmp_path / "t.jsonl"
    out.write_bytes(b"".join(lines[:2]) + lines[2].rstrip(b"\n"))
    cfg = RolloutConfig(env={"id": ENV, "kwargs": {"families": "meta"}, "max_turns": 4}, sampling={"max_new_tokens": 8},
                        episodes=EPISODES, group_size=GROUP, seed=SEED, out=str(out), resume=True)
    plan = plan_resume(cfg, out)
    assert plan.done == 2 and plan.torn_bytes == len(lines[2]) - 1
    third = json.loads(lines[2])
    assert (third["seed"], third["sample"]) in {(s.seed, s.sample) for s in plan.remaining}
    assert len(plan.remaining) == len(EXPECTED_IDS) - 2


def test_nothing_left_to_play_exits_zero(tiny_model_dir, reference, tmp_path, capsys):
    out = tmp_path / "done.jsonl"
    shutil.copy(reference[0], out)
    with out.open("ab") as f:
        f.write(b'{"id": "vaults/vaul')
    with pytest.warns(TornLineWarning, match="moved it to .*done.jsonl.torn"):
        code, stdout, _ = run_in_process(command(tiny_model_dir, out, "--resume"), capsys)
    assert code == 0
    assert f"nothing to resume: {out} already holds all {len(EXPECTED_IDS)} trajectories" in stdout
    assert out.read_bytes() == reference[0].read_bytes(), "only the torn line went (to .torn)"
    assert (tmp_path / "done.jsonl.torn").read_bytes() == b'{"id": "vaults/vaul\n'


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--temperature", "0.5"], r"sampling\.temperature \(--temperature\) is 1\.0 in the file \(line 1\) but 0\.5"),
        (["--seed", "4", "--episodes", "2"], r"sampling\.seed \(--seed\) is 3 in the file .* but 4"),
        (["--max-new-tokens", "12"], r"sampling\.max_new_tokens \(--max-new-tokens\) is 8 in the file .* but 12"),
        (["--split", "dev"], r"split \(--split\) is 'train' in the file .* but 'dev'"),
        (["--context", "window"], r"context_mode \(--context\) is 'chat' in the file .* but 'window'"),
        (["--env", "textworld/simple-v0"], r"env \(--env\) is 'vaults/vaults-v0'"),
        (["--max-turns", "1"], r"turns, more than this command's --max-turns 1"),
        (["--episodes", "1"], r"task seed \d, sample \d, which this command does not play .*task seeds 3\.\.3"),
        (["--group-size", "2"], r"which this command does not play .*samples 0\.\.1\)"),
        (["--model", "{copy}"], r"model \(--model\) is '.*' in the file .* but '.*other-model'"),
    ],
)
def test_mismatched_command_is_refused_and_the_file_untouched(tiny_model_dir, reference, tmp_path, capsys, flags,
                                                              message):
    out = tmp_path / "t.jsonl"
    original = b"".join(reference[0].read_bytes().splitlines(keepends=True)[:-1]) + b'{"id": "torn'
    out.write_bytes(original)
    if "{copy}" in flags:
        shutil.copytree(tiny_model_dir, tmp_path / "other-model")
    code, _, stderr = run_in_process(
        command(tiny_model_dir, out, "--resume", *[f.format(copy=tmp_path / "other-model") for f in flags]), capsys)
    assert code == 2
    assert re.search(message, stderr), stderr
    assert "The file was not changed." in stderr
    assert out.read_bytes() == original
    assert not (tmp_path / "t.jsonl.torn").exists()


def test_mismatch_from_the_command_line_exits_2(tiny_model_dir, reference, tmp_path):
    out = tmp_path / "t.jsonl"
    shutil.copy(reference[0], out)
    result = run_cli(command(tiny_model_dir, out, "--resume", "--top-p", "0.9"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "sampling.top_p (--top-p) is 1.0 in the file" in " ".join(result.stderr.split())
    assert out.read_bytes() == reference[0].read_bytes()


def test_a_duplicated_episode_is_refused(tiny_model_dir, reference, tmp_path, capsys):
    lines = reference[0].read_bytes().splitlines(keepends=True)
    out = tmp_path / "t.jsonl"
    out.write_bytes(b"".join(lines[:3] + lines[1:2]))
    code, _, stderr = run_in_process(command(tiny_model_dir, out, "--resume"), capsys)
    assert code == 2
    assert re.search(r"holds task seed \d, sample \d twice \(lines 2 and 4\)", stderr), stderr
    assert out.read_bytes() == b"".join(lines[:3] + lines[1:2])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--out", "{tmp}/missing.jsonl", "--resume"], r"missing\.jsonl does not exist.*drop --resume"),
        (["--out", "{tmp}/t.jsonl", "--resume", "--overwrite"], r"--resume .*--overwrite.*pick one"),
        (["--resume"], r"--resume needs --out FILE"),
    ],
)
def test_bad_resume_flags_are_clear_errors(tiny_model_dir, tmp_path, capsys, flags, message):
    (tmp_path / "t.jsonl").write_text("")
    from agentkit.cli import main

    code = main(["rollout", "--model", str(tiny_model_dir), "--quiet", *[f.format(tmp=tmp_path) for f in flags]])
    stderr = " ".join(capsys.readouterr().err.split())
    assert code == 2
    assert re.search(message, stderr), stderr
    assert not (tmp_path / "missing.jsonl").exists()
