"""Trajectories as Hugging Face datasets: ``agentkit export`` to Parquet and to a save_to_disk folder,
read back by ``datasets`` itself, and trained on with ``train.demos``."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys

import pytest

datasets = pytest.importorskip("datasets", reason="needs the datasets extra: pip install -e '.[datasets]'")

from agentkit.core.jsonl import TrajectoryWriter, read_trajectories  # noqa: E402


def _cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentkit.cli", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd)


@pytest.fixture()
def trajectories_file(vaults_demos, tmp_path):
    """The vaults demonstrations, plus copies with every optional field set (task type, per-turn
    privileged text and policy version, an error), a turn whose action could not be parsed (None)
    and unequal float logprobs."""
    demos = read_trajectories(vaults_demos)
    varied = []
    for index, t in enumerate(demos[:3]):
        turns = [dataclasses.replace(turn, privileged=f"plan {i}", policy_version=i + index,
                                     response_logprobs=[-0.1234567890123 * (k + 1) for k in range(len(turn.response_ids))])
                 for i, turn in enumerate(t.turns)]
        turns[-1] = dataclasses.replace(turns[-1], action=None, action_valid=False, expert_action=None)  # unparsed
        varied.append(dataclasses.replace(t, id=f"{t.id}-varied", turns=turns, task_type="amber", error="cut",
                                          privileged=None, sampling={"temperature": 0.7, "stop": ["</action>"]}))
    path = tmp_path / "in.jsonl"
    with TrajectoryWriter(path, mode="new") as writer:
        for t in [*demos, *varied]:
            writer.write(t)
    return path


def test_export_round_trips_through_datasets_own_readers(trajectories_file, tmp_path):
    from agentkit.rollout.export import read_source

    original = read_trajectories(trajectories_file)
    for to, read in (("hf", lambda out: datasets.load_from_disk(str(out))),
                     ("parquet", lambda out: datasets.load_dataset("parquet", data_files=str(out / "trajectories.parquet"),
                                                                   split="train"))):
        out = tmp_path / f"dataset-{to}"
        done = _cli("export", str(trajectories_file), "--to", to, str(out), cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        assert f"wrote {len(original)} trajectories" in done.stdout
        loaded = read(out)
        assert len(loaded) == len(original)
        turn = loaded.features["turns"].feature
        assert turn["context_ids"].feature.dtype == "int64" and turn["response_logprobs"].feature.dtype == "float64"
        first = loaded[0]  # nested turns, token ids as int lists, as the JSONL line has them
        line = json.loads(trajectories_file.read_text().splitlines()[0])
        assert first["turns"][0]["response_ids"] == line["turns"][0]["response_ids"]
        assert first["return"] == line["return"] and json.loads(first["sampling"]) == line["sampling"]
        assert read_source(out) == original  # every field, the optional ones and the float logprobs exactly
    assert read_source(tmp_path / "dataset-parquet" / "trajectories.parquet") == original


def test_view_shows_an_exported_dataset(trajectories_file, tmp_path):
    count = len(read_trajectories(trajectories_file))
    for to in ("hf", "parquet"):
        assert _cli("export", str(trajectories_file), "--to", to, str(tmp_path / to), cwd=tmp_path).returncode == 0
        done = _cli("view", str(tmp_path / to), "--out", f"{to}.html", cwd=tmp_path)
        assert done.returncode == 0 and f"({count} episodes)" in done.stdout, done.stderr[-2000:]


def test_export_reads_a_run_folder_in_step_order(trajectories_file, tmp_path):
    from agentkit.rollout.export import source_trajectories

    lines = trajectories_file.read_text().splitlines(keepends=True)
    run = tmp_path / "run"
    (run / "trajectories").mkdir(parents=True)
    (run / "trajectories" / "step-10.jsonl").write_text("".join(lines[:2]))
    (run / "trajectories" / "step-2.jsonl").write_text("".join(lines[2:]))
    (run / "trajectories" / "step-11.jsonl.part").write_text(lines[0])  # a step still playing: not exported
    ids = [t.id for t in read_trajectories(trajectories_file)]
    assert [t.id for t in source_trajectories(run)] == ids[2:] + ids[:2]
    done = _cli("export", str(run), "--to", "hf", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 0 and len(datasets.load_from_disk(str(tmp_path / "out"))) == len(ids), done.stderr


def test_export_refuses_with_one_line_and_keeps_what_is_there(trajectories_file, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    for args, said in (([str(trajectories_file), "--to", "hf", str(taken)], "not an empty folder"),
                       ([str(tmp_path / "missing.jsonl"), "--to", "parquet", str(tmp_path / "x")], "does not exist"),
                       ([str(tmp_path), "--to", "parquet", str(tmp_path / "y")], "no trajectories/step-N.jsonl")):
        done = _cli("export", *args, cwd=tmp_path)
        assert done.returncode != 0 and said in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert (taken / "keep.txt").read_text() == "mine" and sorted(p.name for p in taken.iterdir()) == ["keep.txt"]


@pytest.mark.slow  # 25-45 s here
def test_demos_from_a_dataset_train_exactly_as_from_the_jsonl(vaults_demos, tiny_model_dir, tmp_path):
    """SFT on the exported dataset (both formats) makes the same losses as SFT on the JSONL file."""
    for to in ("hf", "parquet"):
        done = _cli("export", str(vaults_demos), "--to", to, str(tmp_path / to), cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
    losses = {}
    for name, demos in (("jsonl", vaults_demos), ("hf", tmp_path / "hf"), ("parquet", tmp_path / "parquet")):
        done = _cli("train", "--model", str(tiny_model_dir), "--objective", "sft", "--demos", str(demos), "--steps", "2",
                    "--env", "vaults/vaults-v0", "--env-kwargs", "families=amber", "--max-turns", "4",
                    "--eval-every", "0", "--eval-episodes", "2", "--out", str(tmp_path / f"run-{name}"), "--quiet",
                    cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        metrics = [json.loads(line) for line in (tmp_path / f"run-{name}" / "metrics.jsonl").read_text().splitlines()]
        losses[name] = [m["loss"] for m in metrics]
    assert losses["hf"] == losses["jsonl"] == losses["parquet"] and len(losses["jsonl"]) == 2


def test_demos_that_are_no_dataset_are_refused_with_the_fix(tiny_model_dir, tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    done = _cli("train", "--model", str(tiny_model_dir), "--objective", "sft", "--demos", str(folder), "--steps", "1",
                "--env", "vaults/vaults-v0", "--out", str(tmp_path / "run"), "--quiet", cwd=tmp_path)
    assert done.returncode != 0 and "agentkit export" in done.stderr and "Traceback" not in done.stderr, done.stderr
    shutil.rmtree(folder)
