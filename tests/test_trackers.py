"""Experiment trackers (``log.report_to``) on a real short training run, read back offline with each
backend's own reader: TensorBoard's EventAccumulator, W&B's offline run file (its protobuf records),
MLflow's client on a local SQLite store. Each backend's test skips when its package is missing."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import struct
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest
import yaml

from agentkit.core.errors import ConfigError, MissingDependencyError
from agentkit.core.jsonl import read_trajectories
from agentkit.report.trackers import BACKENDS, COLUMNS, EVAL_NOT_METRICS, check_installed, flatten

SETTINGS = ["env.id=vaults/vaults-v0", "env.kwargs.families=amber", "env.max_turns=3", "rollout.tasks_per_step=2",
            "rollout.group_size=2", "sampling.max_new_tokens=12", "eval.every=1", "eval.episodes=2",
            "checkpoint.every=1", "log.table_episodes=3"]
# credentials as a user's shell holds them: they must reach no file, config or tracker
SECRETS = {"WANDB_API_KEY": "agentkitfakewandbkey0123456789abcdef0123", "MLFLOW_TRACKING_TOKEN": "agentkit-fake-mlflow-token",
           "MLFLOW_TRACKING_PASSWORD": "agentkit-fake-mlflow-password", "OPENAI_API_KEY": "sk-agentkit-fake-openai-key",
           "HF_TOKEN": "hf_agentkitfakehubtoken"}
INSTALLED = [name for name, backend in BACKENDS.items() if importlib.util.find_spec(backend.module) is not None]


def _needs(name: str) -> None:
    if name not in INSTALLED:
        pytest.skip(f"{BACKENDS[name].module} is not installed (pip install 'agentkit[{name}]')")


def train_cli(out: Path, model: Path, *, steps: int, resume: bool = False, fault: str | None = None):
    """``agentkit train --report-to`` every installed tracker, W&B offline, MLflow on a SQLite file
    beside the run (its artifacts in the working directory, ``out``'s parent)."""
    from agentkit.core.faults import VARIABLE

    env = {k: v for k, v in os.environ.items() if k != VARIABLE and not k.startswith(("WANDB_", "MLFLOW_"))}
    env |= SECRETS | {"WANDB_MODE": "offline", "WANDB_SILENT": "true",
                      "MLFLOW_TRACKING_URI": f"sqlite:///{out.parent / 'mlflow.db'}"}
    if fault is not None:
        env[VARIABLE] = fault
    command = [sys.executable, "-m", "agentkit.cli", "train", "--out", str(out), "--steps", str(steps), "--quiet",
               "--model", str(model), "--report-to", ",".join(INSTALLED),
               *[arg for kv in SETTINGS for arg in ("--set", kv)], *(["--resume"] if resume else [])]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=out.parent, timeout=900)


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir) -> Path:
    if not INSTALLED:
        pytest.skip("no tracker package installed (pip install 'agentkit[tensorboard,wandb,mlflow]')")
    out = tmp_path_factory.mktemp("trackers") / "run"
    done = train_cli(out, tiny_model_dir, steps=2)
    assert done.returncode == 0, done.stderr
    return out


def _records(run: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (run / name).read_text().splitlines()]


def _scalar_keys(run: Path) -> set[str]:
    """The keys every tracker must hold: each metric of metrics.jsonl, each eval.jsonl figure under eval/."""
    keys = {k for r in _records(run, "metrics.jsonl") for k in flatten({k: v for k, v in r.items() if k != "step"})}
    return keys | {k for r in _records(run, "eval.jsonl")
                   for k in flatten({k: v for k, v in r.items() if k not in EVAL_NOT_METRICS}, "eval/")}


def _episode_ids(run: Path, step: int) -> set[str]:
    return {t.id for t in read_trajectories(run / "trajectories" / f"step-{step}.jsonl")}


# -- what the loop writes and what the trackers get -----------------------------------------------
def test_eval_records_carry_the_eval_report(run):
    for record in _records(run, "eval.jsonl"):
        low, high = record["success_ci95"]
        assert low <= record["success_rate"] <= high
        assert "mean_turns_solved" in record
        assert set(record["by_task_type"]) == {"amber"}  # vaults names the family as the task type


def test_flatten_turns_nested_figures_into_scalars():
    record = {"step": 3, "split": "dev", "success_rate": 0.5, "success_ci95": [0.2, 0.8], "mean_turns_solved": None,
              "won": True, "by_task_type": {"amber": {"episodes": 4, "success_ci95": [0.1, 0.9]}}, "pass_at_k": {"1": 0.5}}
    assert flatten(record, "eval/") == {
        "eval/step": 3.0, "eval/success_rate": 0.5, "eval/success_ci95_low": 0.2, "eval/success_ci95_high": 0.8,
        "eval/won": 1.0, "eval/by_task_type/amber/episodes": 4.0, "eval/by_task_type/amber/success_ci95_low": 0.1,
        "eval/by_task_type/amber/success_ci95_high": 0.9, "eval/pass_at_k/1": 0.5}


def test_report_to_takes_words_or_a_comma_list():
    from agentkit.cli import build_parser
    from agentkit.core.config import settings_from_args
    from agentkit.train.config import TrainConfig, load_config

    args = build_parser().parse_args(["train", "--report-to", "tensorboard,wandb", "mlflow", "wandb"])
    assert load_config(None, None, settings_from_args(args, TrainConfig)).log.report_to == ["tensorboard", "wandb", "mlflow"]
    assert load_config(None, ["log.report_to=none"]).log.report_to == []
    assert load_config(None, None).log.report_to == []  # none unless asked
    with pytest.raises(ConfigError, match=r"--report-to \(log.report_to\): 'tensorbord' is not a tracker. Did you mean "
                                          r"'tensorboard'\?"):
        load_config(None, ["log.report_to=tensorbord"])


@pytest.mark.parametrize("name", list(BACKENDS))
def test_a_tracker_that_is_not_installed_is_refused_before_the_run_starts(name, tmp_path, monkeypatch, capsys):
    from agentkit.cli import main

    monkeypatch.setitem(sys.modules, BACKENDS[name].module, None)  # Python's own mark of a module that cannot be imported
    out = tmp_path / "run"
    assert main(["train", "--report-to", name, "--out", str(out), "--quiet", *[a for kv in SETTINGS for a in ("--set", kv)]]) == 2
    error = capsys.readouterr().err.strip()
    assert error == (f"agentkit: error: --report-to {name}: {BACKENDS[name].module} not installed; "
                     f"pip install 'agentkit[{name}]' (or drop it from log.report_to).")
    assert not out.exists()
    with pytest.raises(MissingDependencyError):
        check_installed([name])


@pytest.mark.slow  # 22 s here
@pytest.mark.skipif("wandb" not in INSTALLED, reason="needs the wandb extra")
def test_a_tracker_that_cannot_start_stops_the_run_with_its_fix_and_resume_goes_on(tiny_model_dir, tmp_path):
    """W&B online with no key (a new user's first try): one line saying what to set; after setting
    it, the same command with --resume trains the run (nothing written before is in the way)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    env |= {"HOME": str(tmp_path / "home"), "WANDB_DIR": str(tmp_path / "wandb")}  # no ~/.netrc key either
    command = [sys.executable, "-m", "agentkit.cli", "train", "--out", str(tmp_path / "run"), "--steps", "1", "--quiet",
               "--model", str(tiny_model_dir), "--report-to", "wandb", *[arg for kv in SETTINGS for arg in ("--set", kv)]]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith("agentkit: error: --report-to wandb: the tracker did not start")
    assert "WANDB_MODE=offline" in done.stderr and "--resume" in done.stderr
    done = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env=env | {"WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / "checkpoints" / "step-1").is_dir()


def test_keys_come_only_from_the_environment(run):
    """No credential of the environment reaches config.yaml, a tracker's config or any file it wrote."""
    config = (run / "config.yaml").read_text()
    leaked = [(path, name) for path in run.parent.rglob("*") if path.is_file()
              for name, secret in SECRETS.items() if secret.encode() in path.read_bytes()]
    assert not leaked, leaked
    assert "train:" in config and not any(s in config for s in SECRETS.values())
    if "wandb" in INSTALLED:
        sent = json.dumps(_wandb_config(_wandb_file(run)))
        assert '"train"' in sent and not any(s in sent for s in SECRETS.values())
    if "mlflow" in INSTALLED:
        client, run_id = _mlflow(run)
        params = client.get_run(run_id).data.params
        assert "train.lr" in params and not any(s in v for v in params.values() for s in SECRETS.values())


# -- TensorBoard --------------------------------------------------------------------------------
def _tensorboard(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def _text(events, tag: str) -> dict[int, str]:
    return {e.step: e.tensor_proto.string_val[0].decode() for e in events.Tensors(f"{tag}/text_summary")}


def test_tensorboard_holds_every_metric_at_its_step_and_the_episode_tables(run):
    _needs("tensorboard")
    events = _tensorboard(run / "tensorboard")
    assert _scalar_keys(run) <= set(events.Tags()["scalars"])
    metrics = _records(run, "metrics.jsonl")
    assert [(e.step, e.value) for e in events.Scalars("tokens")] == [(r["step"], r["tokens"]) for r in metrics]
    evals = _records(run, "eval.jsonl")
    assert [e.step for e in events.Scalars("eval/success_ci95_high")] == [r["step"] for r in evals]
    assert [e.value for e in events.Scalars("eval/success_ci95_high")] == pytest.approx([r["success_ci95"][1] for r in evals])
    tables = _text(events, "episodes")
    assert sorted(tables) == [1, 2]
    for step, table in tables.items():
        header, _, *rows = table.splitlines()
        assert header == "| " + " | ".join(COLUMNS) + " |" and len(rows) == 3
        ids = {row.split(" | ")[1].replace("\\|", "|") for row in rows}
        assert ids <= _episode_ids(run, step)
        assert "<" not in table.replace("<br>", "")  # markup of the texts (<action>) shown as text, not parsed
    config = _text(events, "config")[0]
    assert yaml.safe_load("\n".join(line[4:] for line in config.splitlines())) == yaml.safe_load((run / "config.yaml").read_text())


# -- Weights & Biases (offline) -----------------------------------------------------------------
def _wandb_file(run: Path, index: int = -1) -> Path:
    files = sorted((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert files, f"no offline W&B run in {run / 'wandb'}"
    return files[index]


def _wandb_records(path: Path):
    """The records of a W&B run file: a LevelDB-style log (32 KiB blocks, each record a 7-byte header:
    CRC, length, type) after W&B's 7-byte file header, each record a ``wandb_internal_pb2.Record``.
    W&B ships no Python reader of it (wandb-core, in Go, writes and reads it)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    block, position, pieces = 32768, 7, b""
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        length, kind = struct.unpack("<HB", data[position + 4:position + 7])
        if kind == 0:  # zero padding to the end of the block
            position += block - position % block
            continue
        pieces += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # FULL, or LAST of FIRST/MIDDLE/LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            pieces = b""
            yield record


def _wandb_history(path: Path) -> dict[int, dict[str, object]]:
    history: dict[int, dict[str, object]] = {}
    for record in _wandb_records(path):
        if record.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history.setdefault(record.history.step.num, {}).update(items)
    return history


def _wandb_config(path: Path) -> dict[str, object]:
    config: dict[str, object] = {}
    for record in _wandb_records(path):
        kind = record.WhichOneof("record_type")
        items = record.run.config.update if kind == "run" else record.config.update if kind == "config" else []
        config.update({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items})
    return config


def test_wandb_offline_run_holds_every_metric_the_config_and_the_episode_tables(run):
    _needs("wandb")
    path = _wandb_file(run)
    assert path.name == f"run-{json.loads((run / 'trackers.json').read_text())['wandb']}.wandb"
    history = _wandb_history(path)
    assert sorted(history) == [0, 1, 2]  # step 0: the eval at the start; 1 and 2: the training steps
    for record in _records(run, "metrics.jsonl"):
        assert history[record["step"]]["tokens"] == record["tokens"]
    for record in _records(run, "eval.jsonl"):
        assert history[record["step"]]["eval/success_ci95_low"] == pytest.approx(record["success_ci95"][0])
    assert _scalar_keys(run) <= {key for row in history.values() for key in row}
    assert "episodes/_type" not in history[0]
    for step in (1, 2):
        row = history[step]
        assert row["episodes/_type"] == "table-file"
        table = json.loads((path.parent / "files" / str(row["episodes/path"])).read_text())
        assert table["columns"] == list(COLUMNS) and len(table["data"]) == 3
        assert {r[COLUMNS.index("episode_id")] for r in table["data"]} <= _episode_ids(run, step)
    config = _wandb_config(path)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert {key: config[key] for key in saved} == saved


# -- MLflow (a local SQLite store) ------------------------------------------------------------
def _mlflow(run: Path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run.parent / 'mlflow.db'}")
    return client, json.loads((run / "trackers.json").read_text())["mlflow"]


def test_mlflow_run_holds_every_metric_the_config_and_the_episode_tables(run, tmp_path):
    _needs("mlflow")
    client, run_id = _mlflow(run)
    found = client.get_run(run_id)
    assert found.info.run_name == run.name and found.info.status == "FINISHED"
    assert _scalar_keys(run) <= set(found.data.metrics)
    metrics = _records(run, "metrics.jsonl")
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "tokens")] == [(r["step"], r["tokens"]) for r in metrics]
    evals = _records(run, "eval.jsonl")
    history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "eval/success_ci95_high"))
    assert [step for step, _ in history] == [r["step"] for r in evals] == [0, 1, 2]  # steps exactly, values within float tolerance
    assert [value for _, value in history] == pytest.approx([r["success_ci95"][1] for r in evals])
    assert found.data.params["train.lr"] == str(yaml.safe_load((run / "config.yaml").read_text())["train"]["lr"])
    config = Path(client.download_artifacts(run_id, "config.yaml", str(tmp_path)))
    assert yaml.safe_load(config.read_text()) == yaml.safe_load((run / "config.yaml").read_text())
    for step in (1, 2):
        table = json.loads(Path(client.download_artifacts(run_id, f"episodes/step-{step}.json", str(tmp_path))).read_text())
        assert table["columns"] == list(COLUMNS) and len(table["data"]) == 3
        assert {r[COLUMNS.index("episode_id")] for r in table["data"]} <= _episode_ids(run, step)


# -- from a table row to the episode in agentkit view -------------------------------------------
def test_a_table_row_opens_its_episode_in_the_report(run, tmp_path, monkeypatch, capsys):
    """A row's file holds its episode, and its view command writes the report and prints the link
    whose address names that episode, which the report holds."""
    from agentkit.cli import main
    from agentkit.report.view import collect

    _needs("tensorboard")
    row = _text(_tensorboard(run / "tensorboard"), "episodes")[2].splitlines()[2]
    cells = dict(zip(COLUMNS, (c.replace("\\|", "|") for c in row.strip("| ").split(" | ")), strict=True))
    assert cells["episode_id"] in {t.id for t in read_trajectories(cells["file"])}
    argv = shlex.split(cells["view"])
    assert argv[:2] == ["agentkit", "view"]
    monkeypatch.chdir(tmp_path)
    assert main(argv[1:]) == 0
    link = capsys.readouterr().out.splitlines()[-1].split(": ", 1)[1]
    assert link.startswith((tmp_path / "report.html").as_uri() + "#episode=")
    assert unquote(link.split("#episode=", 1)[1]) == cells["episode_id"]
    assert cells["episode_id"] in {e["id"] for e in collect(Path(cells["file"]))["episodes"]}
    assert main(["view", cells["file"], "--out", "other.html", "--episode", "no-such-id"]) == 2
    assert "--episode 'no-such-id': no episode with that id in" in capsys.readouterr().err
    assert not (tmp_path / "other.html").exists()


# -- resume ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_resumed_run_reports_to_the_same_runs_without_a_step_twice(tmp_path, tiny_model_dir):
    """Killed while writing step 2's checkpoint (after step 2 was reported), resumed from step 1: step 2
    is played again and each tracker holds steps 1, 2, 3 once (and the eval at the start, step 0, once),
    in the same W&B and MLflow runs."""
    out = tmp_path / "run"
    killed = train_cli(out, tiny_model_dir, steps=3, fault="checkpoint.write@2")
    assert killed.returncode != 0
    assert [r["step"] for r in _records(out, "metrics.jsonl")] == [1, 2]
    ids = json.loads((out / "trackers.json").read_text())
    resumed = train_cli(out, tiny_model_dir, steps=3, resume=True)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((out / "trackers.json").read_text()) == ids
    metrics = _records(out, "metrics.jsonl")
    assert [r["step"] for r in metrics] == [1, 2, 3]
    assert [r["step"] for r in _records(out, "eval.jsonl")] == [0, 1, 2, 3]  # the eval at the start once
    if "tensorboard" in INSTALLED:
        events = _tensorboard(out / "tensorboard")
        assert [(e.step, e.value) for e in events.Scalars("tokens")] == [(r["step"], r["tokens"]) for r in metrics]
        assert sorted(_text(events, "episodes")) == [1, 2, 3]
    if "mlflow" in INSTALLED:
        client, run_id = _mlflow(out)
        assert [m.step for m in client.get_metric_history(run_id, "tokens")] == [1, 2, 3]
        assert sorted(m.step for m in client.get_metric_history(run_id, "eval/success_rate")) == [0, 1, 2, 3]
    if "wandb" in INSTALLED:  # offline, each attempt writes a file of its own for the same run id; W&B drops
        # the steps it already has when the second is synced (resume="allow"), as it does online
        files = sorted((out / "wandb").glob("offline-run-*/run-*.wandb"))
        assert {f.name for f in files} == {f"run-{ids['wandb']}.wandb"} and len(files) == 2
        steps = sorted(_wandb_history(files[-1]))
        assert 1 not in steps and steps[-1] == 3
