"""Experiment trackers (``log.report_to``): TensorBoard, Weights & Biases, MLflow.

The run folder stays the record; a tracker gets a copy of it as the loop writes it: every metric of
each ``metrics.jsonl`` record at its step, every ``eval.jsonl`` record under ``eval/`` (nested
values flattened: ``success_ci95`` -> ``eval/success_ci95_low`` and ``_high``, ``by_task_type`` ->
``eval/by_task_type/TYPE/success_rate``, ...; text and None are left out), the run's config once at
the start (what config.yaml holds), and each step a table of a few of its episodes whose ids are
those ``agentkit view`` shows (each row carries the trajectory file and the ``view`` command that
opens the report at that episode). Only the main process reports.

Credentials come from the environment only (``WANDB_API_KEY``, ``MLFLOW_TRACKING_URI``,
``MLFLOW_TRACKING_TOKEN``, ...): each backend reads its own; nothing here reads, stores or sends them.

Resume: RUN_DIR/trackers.json keeps the W&B and MLflow run ids, and a resumed run reports to the
same runs. The steps after the checkpoint, played again, are not reported twice: TensorBoard drops
the earlier attempt's events from that step on (``purge_step``); W&B (``resume="allow"``), online,
ignores steps below the run's current one (offline, each attempt writes a file of its own for the
same run id, the replayed steps in the later one); MLflow, which keeps every value logged, is not
sent a metric at a step it already holds.
"""

from __future__ import annotations

import html
import importlib.util
import json
import os
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import yaml

from agentkit.core import runs
from agentkit.core.errors import ConfigError, MissingDependencyError
from agentkit.core.trajectory import Trajectory

STATE_FILE = "trackers.json"  # the backends' run ids, for --resume
CELL_CHARS = 2000  # longer texts are cut in the episode tables


@dataclass(frozen=True)
class EpisodeRow:
    """One row of a step's episode table."""

    step: int
    episode_id: str  # Trajectory.id, as agentkit view lists it
    task: str
    prompt: str  # the first observation the policy answered
    response: str  # the policy's responses, 'turn N: ...' for each turn
    reward: float  # the episode's return
    won: bool
    file: str  # the trajectory file holding the episode
    view: str  # the command that writes the report and prints the link opening this episode


COLUMNS = tuple(f.name for f in fields(EpisodeRow))


class Tracker(Protocol):
    """An experiment tracker: what the run folder records, sent as it is written."""

    def log_config(self, config: dict[str, Any]) -> None:
        """The run's settings (config.yaml's content), at the start of the run or of a resume."""

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Scalars of ``step``: 1-based for training steps, as in metrics.jsonl; 0 for the eval at the start."""

    def log_episodes(self, rows: Sequence[EpisodeRow], step: int) -> None:
        """The table of a few of the step's episodes."""

    def close(self) -> None:
        """Flush and end the run."""


def _cut(text: str) -> str:
    return text if len(text) <= CELL_CHARS else text[:CELL_CHARS] + " [...]"


def episode_row(trajectory: Trajectory, *, step: int, file: Path) -> EpisodeRow:
    """The table row of ``trajectory``, which ``file`` holds (named by its absolute path)."""
    from agentkit.report.view import view_command

    file = file.resolve()
    responses = "\n".join(f"turn {i}: {turn.response_text}" for i, turn in enumerate(trajectory.turns, start=1))
    return EpisodeRow(step=step, episode_id=trajectory.id, task=trajectory.task,
                      prompt=_cut(trajectory.turns[0].observation if trajectory.turns else ""),
                      response=_cut(responses), reward=float(trajectory.episode_return), won=bool(trajectory.won),
                      file=str(file), view=view_command(file, trajectory.id))


EVAL_NOT_METRICS = ("step", "won_by_seed")  # eval.jsonl keys that are no metric: the step, per-episode outcomes


def flatten(record: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of ``record`` as scalars: nested dicts joined with ``/``, a ``*_ci95`` pair as
    ``*_ci95_low`` and ``*_ci95_high``, other lists by index; text and None left out."""
    out: dict[str, float] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, bool | int | float):
            out[name] = float(value)
        elif isinstance(value, dict):
            out.update(flatten(value, f"{name}/"))
        elif isinstance(value, list | tuple):
            if str(key).endswith("ci95") and len(value) == 2:
                out.update(flatten({"low": value[0], "high": value[1]}, f"{name}_"))
            else:
                out.update(flatten({str(i): v for i, v in enumerate(value)}, f"{name}/"))
    return out


# -- state kept in the run folder ----------------------------------------------------------------
def _stored_id(run_dir: Path, backend: str) -> str | None:
    path = run_dir / STATE_FILE
    return json.loads(path.read_text()).get(backend) if path.exists() else None


def _store_id(run_dir: Path, backend: str, run_id: str) -> None:
    path = run_dir / STATE_FILE
    state = json.loads(path.read_text()) if path.exists() else {}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({**state, backend: run_id}, indent=1) + "\n")
    os.replace(tmp, path)


# -- backends ------------------------------------------------------------------------------------
class TensorBoardTracker:
    """Event files in RUN_DIR/tensorboard: scalars, the config and the episode tables as text."""

    def __init__(self, run_dir: Path, *, project: str | None, first_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # events an earlier attempt wrote at the steps played again are dropped when read
        self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=first_step + 1)
        self.first_step = first_step

    def log_config(self, config: dict[str, Any]) -> None:
        text = yaml.safe_dump(config, sort_keys=False)
        self.writer.add_text("config", "    " + text.replace("\n", "\n    "), global_step=self.first_step)
        self.writer.flush()

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()  # each step whole on disk, as metrics.jsonl is

    def log_episodes(self, rows: Sequence[EpisodeRow], step: int) -> None:
        def cell(value: Any) -> str:  # markdown: markup such as <action> shown as text, one line per row
            return "<br>".join(html.escape(str(value), quote=False).replace("|", "\\|").splitlines())

        table = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        table += ["| " + " | ".join(cell(v) for v in astuple(row)) + " |" for row in rows]
        self.writer.add_text("episodes", "\n".join(table), global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A W&B run (online, or offline with WANDB_MODE=offline: files under RUN_DIR/wandb), named after
    the run folder; project: log.project, else WANDB_PROJECT, else agentkit."""

    def __init__(self, run_dir: Path, *, project: str | None, first_step: int) -> None:
        import wandb

        self.wandb = wandb
        self.run = wandb.init(project=project or os.environ.get("WANDB_PROJECT") or "agentkit", name=run_dir.name,
                              dir=str(run_dir), id=_stored_id(run_dir, "wandb"), resume="allow")
        _store_id(run_dir, "wandb", self.run.id)

    def log_config(self, config: dict[str, Any]) -> None:
        self.run.config.update(config, allow_val_change=True)  # a resume may extend train.steps

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_episodes(self, rows: Sequence[EpisodeRow], step: int) -> None:
        self.run.log({"episodes": self.wandb.Table(columns=list(COLUMNS), data=[list(astuple(r)) for r in rows])},
                     step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    """An MLflow run at MLFLOW_TRACKING_URI (MLflow's default without it), named after the run folder;
    experiment: log.project, else MLFLOW_EXPERIMENT_NAME, else agentkit. The config goes as
    parameters (each cut to 500 characters) and whole as the artifact config.yaml; each step's
    table as the artifact episodes/step-N.json (``mlflow.load_table`` reads it)."""

    PARAM_CHARS = 500  # the smallest limit of the MLflow versions in use

    def __init__(self, run_dir: Path, *, project: str | None, first_step: int) -> None:
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient()
        run_id = _stored_id(run_dir, "mlflow")
        self.resumed = False
        if run_id is not None:
            try:
                self.client.get_run(run_id)
                self.resumed = True
            except MlflowException as err:  # not at this tracking URI: the run starts a new one there
                if err.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
        if not self.resumed:
            name = project or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "agentkit"
            experiment = self.client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
            run_id = self.client.create_run(experiment_id, run_name=run_dir.name).info.run_id
            _store_id(run_dir, "mlflow", run_id)
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id
        # the last step of each metric the run holds: MLflow keeps every value, so none is sent twice
        self.reported = {key: max(m.step for m in self.client.get_metric_history(run_id, key))
                         for key in self.client.get_run(run_id).data.metrics} if self.resumed else {}

    @staticmethod
    def _key(name: str) -> str:
        return re.sub(r"[^\w\-. :/]", "_", name)  # the characters MLflow allows in names

    def log_config(self, config: dict[str, Any]) -> None:
        from mlflow.entities import Param

        if not self.resumed:  # parameters cannot change once logged; config.yaml below is the current one
            params = [Param(self._key(k), str(v)[: self.PARAM_CHARS]) for k, v in _dotted(config).items()]
            for start in range(0, len(params), 100):  # MLflow takes at most 100 parameters a call
                self.client.log_batch(self.run_id, params=params[start:start + 100])
        self.client.log_dict(self.run_id, config, "config.yaml")

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        sent = [Metric(key, value, now, step) for key, value in ((self._key(k), v) for k, v in metrics.items())
                if step > self.reported.get(key, -1)]  # -1: step 0 (the eval at the start) is sent too
        for start in range(0, len(sent), 1000):  # and at most 1000 metrics
            self.client.log_batch(self.run_id, metrics=sent[start:start + 1000])

    def log_episodes(self, rows: Sequence[EpisodeRow], step: int) -> None:
        table = {column: [getattr(row, column) for row in rows] for column in COLUMNS}
        self.client.log_table(self.run_id, data=table, artifact_file=f"episodes/{runs.step_name(step)}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _dotted(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(_dotted(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@dataclass(frozen=True)
class Backend:
    module: str  # the package that must be installed (the extra of the same name brings it)
    make: Callable[..., Tracker]
    fix: str  # what to do when it does not start


BACKENDS: dict[str, Backend] = {
    "tensorboard": Backend("tensorboard", TensorBoardTracker, "check that the run folder is writable"),
    "wandb": Backend("wandb", WandbTracker, "set WANDB_API_KEY (or run `wandb login`), or WANDB_MODE=offline to keep the "
                                            "W&B run in the run folder (wandb sync uploads it later)"),
    "mlflow": Backend("mlflow", MlflowTracker, "set MLFLOW_TRACKING_URI to a tracking server (http://HOST:5000) or a "
                                               "local database (sqlite:///mlflow.db)"),
}


def check_installed(names: Sequence[str]) -> None:
    """Refuse trackers whose package is not installed, naming the extra that brings each."""
    missing = [name for name in names if importlib.util.find_spec(BACKENDS[name].module) is None]
    if missing:
        raise MissingDependencyError(
            f"--report-to {' '.join(missing)}: {', '.join(BACKENDS[n].module for n in missing)} not installed; "
            f"pip install 'agentkit[{','.join(missing)}]' (or drop it from log.report_to).")


class Trackers:
    """The run's trackers, which the training loop calls at its named points (none: every call is free)."""

    def __init__(self, trackers: Sequence[Tracker] = (), *, table_episodes: int = 0, seed: int = 0) -> None:
        self.trackers = list(trackers)
        self.table_episodes = table_episodes
        self.seed = seed

    def log_step(self, step: int, record: dict[str, Any], trajectories: Sequence[Trajectory], file: Path) -> None:
        """A metrics.jsonl record and a table of a few of the step's episodes (read from ``file``)."""
        if not self.trackers:
            return
        metrics = flatten({k: v for k, v in record.items() if k != "step"})
        chosen = random.Random(f"{self.seed}:{step}:table").sample(list(trajectories),
                                                                   min(self.table_episodes, len(trajectories)))
        rows = [episode_row(t, step=step, file=file) for t in sorted(chosen, key=lambda t: t.id)]
        for tracker in self.trackers:
            tracker.log_metrics(metrics, step)
            if rows:
                tracker.log_episodes(rows, step)

    def log_eval(self, step: int, record: dict[str, Any]) -> None:
        """An eval.jsonl record, under ``eval/``."""
        metrics = flatten({k: v for k, v in record.items() if k not in EVAL_NOT_METRICS}, "eval/")
        for tracker in self.trackers:
            tracker.log_metrics(metrics, step)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()


def open_trackers(names: Sequence[str], run_dir: Path, *, config: dict[str, Any], first_step: int,
                  project: str | None, table_episodes: int, seed: int) -> Trackers:
    """Start the trackers ``names`` for the run in ``run_dir`` (resumed from ``first_step``) and send
    them its config."""
    check_installed(names)
    started = Trackers()
    for name in names:
        try:
            tracker = BACKENDS[name].make(run_dir, project=project, first_step=first_step)
            tracker.log_config(config)
        except Exception as err:  # each package fails in its own way (no key, no store, no server): one line
            started.close()
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ConfigError(f"--report-to {name}: the tracker did not start ({reason}); {BACKENDS[name].fix}, "
                              f"then run the same command again with --resume.") from err
        started.trackers.append(tracker)
    started.table_episodes, started.seed = table_episodes, seed
    return started
