"""What a new user meets in the first hour: a mistyped model path, a run folder as --model, the
plot of several runs, Ctrl-C during a rollout."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from agentkit.core.errors import ModelError
from agentkit.core.trajectory import JSON_KEY, OMIT_NONE, REQUIRED


# =============================================================================================
# --model paths
# =============================================================================================
def fake_run(root: Path, model_dir: Path, steps: list[int], incomplete: list[int] = ()) -> Path:
    """A training run folder as ``agentkit train`` leaves it: config.yaml and checkpoints/step-N/."""
    run = root / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("steps: 4\n")
    for step in [*steps, *incomplete]:
        folder = run / "checkpoints" / f"step-{step}"
        shutil.copytree(model_dir, folder)
        if step in steps:
            (folder / "COMPLETE").write_text(json.dumps({p.name: p.stat().st_size for p in sorted(folder.iterdir())}))
    return run


@pytest.mark.parametrize("loader", ["load_tokenizer", "load_causal_lm"])
def test_missing_model_folder_fails_at_once(tmp_path, loader, monkeypatch):
    """No hub lookup: the error names the path and how to build a model, in seconds."""
    import agentkit.rollout.hf_backend as hf
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401 - imported before the clock starts

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for given in (tmp_path / "no-such-model", "no-such-model", "runs/tiny-modle"):
        start = time.monotonic()
        with pytest.raises(ModelError, match=rf"{re.escape(str(given))} does not exist.*agentkit model init --out"):
            getattr(hf, loader)(given)
        assert time.monotonic() - start < 5.0  # a hub lookup offline takes ~50 s


def test_loaders_name_a_run_folder(tiny_model_dir, tmp_path):
    from agentkit.rollout.hf_backend import load_causal_lm, load_tokenizer

    run = fake_run(tmp_path, tiny_model_dir, [1])
    for loader in (load_tokenizer, load_causal_lm):
        with pytest.raises(ModelError, match=rf"{re.escape(str(run))} is a training run folder.*checkpoints/step-N"):
            loader(run)


def test_resolve_model_dir(tiny_model_dir, tmp_path, capsys, monkeypatch):
    from agentkit.models import resolve_model_dir

    assert resolve_model_dir(tiny_model_dir) == tiny_model_dir
    assert resolve_model_dir(str(tiny_model_dir)) == tiny_model_dir
    assert capsys.readouterr().err == ""

    run = fake_run(tmp_path, tiny_model_dir, [2, 10], incomplete=[12])
    for given in (run, run / "checkpoints"):
        assert resolve_model_dir(given) == run / "checkpoints" / "step-10"
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "newest checkpoint" in err and "step-10" in err

    empty = tmp_path / "empty-run"
    (empty / "checkpoints" / "step-3").mkdir(parents=True)  # never completed
    with pytest.raises(ModelError, match=r"no complete checkpoint yet.*--resume"):
        resolve_model_dir(empty)

    (tmp_path / "plain").mkdir()
    with pytest.raises(ModelError, match=r"plain: not a model folder \(no config.json\).*agentkit model init"):
        resolve_model_dir(tmp_path / "plain")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ModelError, match=r"is a file"):
        resolve_model_dir(tmp_path / "file")

    # mistyped local paths never reach the hub: absolute, nested, relative to an existing folder
    monkeypatch.chdir(tmp_path)
    for given in (tmp_path / "modle", "a/b/c", "./modle", "plain/modle", "modle"):
        start = time.monotonic()
        with pytest.raises(ModelError, match=rf"--teacher model:{re.escape(str(given))}: no such folder.*model init"):
            resolve_model_dir(given, flag="--teacher model:")
        assert time.monotonic() - start < 5.0  # a hub lookup offline takes ~50 s

    # an org/name id not in the cache, with the hub unreachable (nothing listens there): one line
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", "http://127.0.0.1:9")
    start = time.monotonic()
    with pytest.raises(ModelError, match=r"^--model no-such-org/no-such-model: no such folder, and the Hugging Face "
                                         r"hub could not be asked \(\w+\)\. Check the path.*model init --out DIR$"):
        resolve_model_dir("no-such-org/no-such-model")
    assert time.monotonic() - start < 30.0
    assert "looking for a model of that name on the Hugging Face hub" in capsys.readouterr().err

    # an org/name id not in the cache, with the hub offline: at once, saying so
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(ModelError, match=r"--model no-such-org/no-such-model: no such folder.*HF_HUB_OFFLINE"):
        resolve_model_dir("no-such-org/no-such-model")


# =============================================================================================
# agentkit plot
# =============================================================================================
def write_run(folder: Path, metrics: list[dict], evals: list[dict]) -> Path:
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    (folder / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    return folder


def test_plot_one_colour_per_run_and_demonstrations_apart(tmp_path):
    from matplotlib.colors import to_hex

    from agentkit.report.plots import DEMOS, figure, plot_runs

    # run "sft": two steps on demonstrations (the expert's 100%), then two on its own rollouts;
    # run "grpo" has a metric the other lacks, so its series is first in that panel
    sft = write_run(tmp_path / "sft", [
        {"step": s, "data": "demonstrations" if s <= 2 else "rollouts", "success_rate": 1.0 if s <= 2 else 0.25,
         "return_mean": 1.0, "loss": 1.0 / s} for s in (1, 2, 3, 4)], [{"step": 4, "success_rate": 0.5}])
    grpo = write_run(tmp_path / "grpo", [
        {"step": s, "data": "rollouts", "success_rate": 0.5, "return_mean": 0.5, "loss": 0.1, "kl": 0.01}
        for s in (1, 2)], [{"step": 2, "success_rate": 0.5}])
    fig, data = figure([sft, grpo])
    colours: dict[str, set[str]] = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            colours.setdefault(line.get_label().removesuffix(DEMOS), set()).add(to_hex(line.get_color()))
    assert set(colours) == {"sft", "grpo"}
    assert all(len(c) == 1 for c in colours.values()) and colours["sft"] != colours["grpo"], colours
    success = {s.label: s.points for s in data["success_rate"]}
    assert success == {"sft": [(3, 0.25), (4, 0.25)], "sft" + DEMOS: [(1, 1.0), (2, 1.0)], "grpo": [(1, 0.5), (2, 0.5)]}
    assert [s.label for s in data["loss"]] == ["sft", "grpo"]  # the loss on demonstrations is the policy's own
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend[:2] == ["sft", "grpo"] and "demonstrations" in legend[2]

    from PIL import Image

    out = plot_runs([sft, grpo], tmp_path / "curves.png")
    drawn = json.loads(Image.open(out).text["Description"])
    assert drawn["success_rate"] == {"sft": 2, "sft" + DEMOS: 2, "grpo": 2} and drawn["kl"] == {"grpo": 2}


# =============================================================================================
# Ctrl-C
# =============================================================================================
def interrupt_group(args: list[str], started, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``args`` in its own process group, and once ``started()`` is true send SIGINT to the
    whole group, as a terminal's Ctrl-C does."""
    # SIGINT at its default disposition, as from a shell (an ignored one would be inherited)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + timeout
        while not started() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, f"it ended before it was interrupted: {proc.communicate()}"
        assert started(), f"not started within {timeout} s"
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


POOL_SCRIPT = """
import functools, sys
from agentkit.envs import make
from agentkit.rollout.workers import WorkerPool
if __name__ == "__main__":
    pool = WorkerPool(functools.partial(make, "textworld/coin-v0", split="train", max_turns=1000), 2)
    try:
        for slot in range(4):
            pool.submit(slot, "reset", slot)
        while True:  # step all four episodes forever
            for result in pool.poll(1.0):
                pool.submit(result.slot, "step", "look")
                print("stepped", flush=True)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    finally:
        pool.close()
"""


def test_ctrl_c_leaves_worker_processes_quiet(tmp_path):
    """The workers get the terminal's SIGINT too: they ignore it, the parent closes them."""
    pytest.importorskip("textworld")
    script = tmp_path / "pool.py"
    script.write_text(POOL_SCRIPT)
    log = tmp_path / "stdout"
    with log.open("w") as stdout:
        proc = subprocess.Popen([sys.executable, str(script)], stdout=stdout, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.monotonic() + 300
        while log.read_text().count("stepped") < 20 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    lines = [line for line in err.splitlines() if not line.startswith("generating TextWorld games")]  # first use
    assert proc.returncode == 0 and lines == ["interrupted"], err


def test_closing_a_pool_drops_its_queue(tmp_path):
    """Closing (as after Ctrl-C) waits for the request each worker is serving, not for its queue:
    here twenty first-use resets, each generating a game."""
    pytest.importorskip("textworld")
    import functools

    from agentkit.envs import make
    from agentkit.rollout.workers import WorkerPool

    pool = WorkerPool(functools.partial(make, "textworld/coin-v0", split="train", cache=str(tmp_path)), 2)
    try:
        for slot in range(20):
            pool.submit(slot, "reset", slot)
        assert pool.poll(120.0), "no game generated within 120 s"
    finally:
        start = time.monotonic()
        pool.close()
        closed_s = time.monotonic() - start
    assert closed_s < 8.0, f"close() took {closed_s:.1f} s: it waited for the queued resets"
    assert all(not process.is_alive() for process in (w.process for w in pool._workers))
    assert len(list(tmp_path.rglob("game.z8"))) < 12  # the queued games were never generated


def test_ctrl_c_in_rollout_prints_one_line_and_the_resume_hint(tmp_path):
    """``agentkit rollout`` with two env workers, interrupted once episodes are being played."""
    pytest.importorskip("textworld")
    out = tmp_path / "rollout.jsonl"
    cmd = [sys.executable, "-m", "agentkit.cli", "rollout", "--env", "textworld/coin-v0", "--env-workers", "2",
           "--episodes", "200", "--max-in-flight", "4", "--out", str(out)]
    done = interrupt_group(cmd, lambda: out.exists() and out.stat().st_size > 0)
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if "interrupted" in line]
    assert len(lines) == 1 and "--resume" in lines[0] and str(out) in lines[0], done.stderr
    assert done.returncode == 130


# =============================================================================================
# first-use game generation says what it is doing
# =============================================================================================
def test_textworld_generation_says_so(tmp_path, capsys):
    pytest.importorskip("textworld")
    from agentkit.envs.textworld_env import TextWorldEnv

    env = TextWorldEnv("tw-coin_collector", split="train", cache=str(tmp_path), level=1)
    env.prepare([0, 1, 0])
    err = capsys.readouterr().err
    assert re.fullmatch(rf"generating 2 TextWorld games for tw-coin_collector \(train split\) on first use, 1-3 s "
                        rf"each; cached under {re.escape(str(tmp_path))}/tw-coin_collector-\w+\n", err), err
    env.prepare([1, 0])  # cached: nothing to say
    env.reset(seed=0)
    assert capsys.readouterr().err == ""
    # a game generated at its first reset, with no prepare(): the same line, without a count, once
    env.reset(seed=2)
    env.reset(seed=3)
    assert capsys.readouterr().err == ""  # this process already said it generates into that folder
    other = TextWorldEnv("tw-coin_collector", split="eval", cache=str(tmp_path), level=1)
    other.reset(seed=0)
    assert capsys.readouterr().err.startswith("generating TextWorld games for tw-coin_collector (eval split) on first use")
    env.close()
    other.close()


# =============================================================================================
# the trajectory schema is the dataclasses
# =============================================================================================
@dataclass(frozen=True)
class Record:  # annotations are resolved in this module's namespace, so it lives at module level
    name: str
    ids: list[int]
    value: float = field(metadata={JSON_KEY: "val"})
    mode: Literal["a", "b"] = "a"
    note: str | None = field(default=None, metadata={OMIT_NONE: True})
    version: int = field(default=1, metadata={REQUIRED: True})


def test_record_checks_are_read_off_the_dataclass_fields():
    """A field declared once, on the dataclass, is what the reader checks and the writer writes."""
    from agentkit.core.trajectory import Trajectory, _Schema

    schema = _Schema.of(Record)
    assert schema.types == {"name": (str,), "ids": (list,), "val": (int, float), "mode": (str,),
                            "note": (str, type(None)), "version": (int,)}
    assert schema.optional == {"mode", "note"} and schema.choices == {"mode": ("a", "b")}
    assert schema.renamed == {"value": "val"} and schema.omit_none == ("note",)
    # and Trajectory's own: "return" in files, task_type written only when set, the version required
    trajectory = _Schema.of(Trajectory)
    assert trajectory.renamed == {"episode_return": "return"} and trajectory.omit_none == ("task_type",)
    assert "schema_version" not in trajectory.optional and "context_mode" in trajectory.optional
