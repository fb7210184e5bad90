"""The run folder's lifecycle: what ``agentkit train`` writes there and how a run starts or resumes in it.

``prepare_run`` makes a new run's folder (refusing one that holds a run) or checks a resumed one (its
newest checkpoint whole, only the settings that may change given otherwise: runtime ones applied to
this invocation) and drops what a crashed run wrote after its last checkpoint. Records are written
whole or not at all (``append_jsonl``, ``write_jsonl``, ``write_atomic``); a full disk becomes one
``DiskFullError`` naming the file. The folder's layout (which file holds what) is ``agentkit.core.runs``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from agentkit.core import runs
from agentkit.core.config import MISSING, get_dotted, settings_of
from agentkit.core.errors import AgentkitError, ConfigError, disk_full, no_space
from agentkit.core.jsonl import append_whole
from agentkit.core.runs import checkpoints, step_folders
from agentkit.report.trackers import check_installed
from agentkit.rollout.backends import backend_kind
from agentkit.rollout.run import capped_episodes, check_env_settings, held_out_split, resolve_env
from agentkit.train.checkpoint import check_complete
from agentkit.train.config import TrainConfig, dump_config, load_config
from agentkit.train.episodes import run_tasks
from agentkit.train.lora import check_peft
from agentkit.train.scoring import resolve_teacher_spec


@contextlib.contextmanager
def writing(path: Path, what: str):
    """A full disk while writing ``path`` becomes a ``DiskFullError`` naming it (the loop adds how to resume)."""
    try:
        yield
    except OSError as err:
        if not no_space(err):
            raise
        raise disk_full(what, path, err, "What was written before is whole. Free some space there to go on.") from err


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one line, whole or not at all: a write cut short (the disk filling up) is undone."""
    with writing(path, "a record to"), path.open("ab", buffering=0) as f:
        append_whole(f, (json.dumps(record) + "\n").encode())


def truncate_jsonl(path: Path, last_step: int) -> None:
    """On resume, drop lines a crashed run wrote after its last checkpoint (and a last line torn by
    the crash); the file is replaced atomically, so a second crash here loses nothing."""
    if not path.exists():
        return
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    kept = []
    for number, line in enumerate(lines, start=1):
        try:
            step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError) as err:
            if number == len(lines):
                break  # torn by the crash
            raise ConfigError(f"--resume: {path} line {number} is not a record with a step ({err}); "
                              "fix or delete that line.") from err
        if step <= last_step:
            kept.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


def write_atomic(path: Path, text: str) -> None:
    """Write a whole file at once (temporary name, then renamed); on a full disk the old one stays."""
    tmp = path.with_name(path.name + ".tmp")
    with writing(path, "the file"):
        try:
            tmp.write_text(text)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
    os.replace(tmp, path)


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "".join(json.dumps(r, separators=(",", ":"), allow_nan=False) + "\n" for r in records))


def drop_lost_steps(run_dir: Path, last_step: int, *, keep_trajectories: bool = False) -> None:
    """On resume, remove the trajectory and signal files of the steps after the checkpoint: they are
    played again. ``keep_trajectories`` (async runs): the trajectory files stay, the generator's
    buffer; the steps after the checkpoint train on them again as they are."""
    prefix = f"{runs.STEP_PREFIX}*"
    trajectories = [] if keep_trajectories else list(runs.trajectories_dir(run_dir).glob(prefix))
    for path in [*trajectories, *runs.signals_dir(run_dir).glob(f"{prefix}.jsonl*")]:
        number = runs.step_of(path.name.split(".")[0])
        if number is not None and number > last_step:
            path.unlink()


def resolve_defaults(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with the environment's own defaults filled in (turn limit, held-out split), as the
    run's config.yaml records them."""
    env = resolve_env(cfg.env)
    return cfg.model_copy(update={"env": env, "eval": cfg.eval.model_copy(
        update={"split": cfg.eval.split or held_out_split(env.id)})})


def never_started(run_dir: Path) -> bool:
    """A run folder that holds no finished step: no checkpoint and no metrics line (it failed
    before its first step); starting a run there again loses nothing."""
    if not runs.config_file(run_dir).exists() or runs.checkpoints_dir(run_dir).exists():
        return False
    metrics = runs.metrics_file(run_dir)
    return not (metrics.exists() and metrics.read_text().strip())


def _resume_differences(cfg: TrainConfig, saved: TrainConfig, given: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The settings ``given`` for a resume that differ from the run's: (conflicts: what the run computes,
    refused; runtime: how it is carried out, ``Setting.runtime``, applied to this invocation: their
    dotted keys). A dict setting (``env.kwargs``) differs where a key given differs."""
    rows = {row.key: row for row in settings_of(TrainConfig)}
    conflicts, runtime = [], []
    command_values, run_values = cfg.model_dump(), saved.model_dump()
    for key in sorted(given):
        if key in ("train.steps", "out"):
            continue
        row = rows.get(key) or next((r for k, r in rows.items() if key.startswith(f"{k}.")), None)
        ours, theirs = get_dotted(command_values, key), get_dotted(run_values, key)
        if isinstance(ours, str) and isinstance(theirs, str) and Path(ours).exists() and Path(theirs).exists():
            differs = Path(ours).resolve() != Path(theirs).resolve()  # the same folder, however written
        elif isinstance(ours, dict) and isinstance(theirs, dict):
            differs = any(theirs.get(k, MISSING) != v for k, v in ours.items() if k in (given[key] or {}))
        else:
            differs = ours != theirs
        if not differs:
            continue
        if row is not None and row.runtime:
            runtime.append(row.key)
        else:
            name = f"{row.flag} ({key})" if row is not None and row.key == key else key
            shown = "(not set)" if theirs is MISSING else repr(theirs)
            conflicts.append(f"{name} is {shown} in the run but {ours!r} in this command")
    return conflicts, runtime


def _with_runtime(saved: TrainConfig, cfg: TrainConfig, keys: list[str]) -> tuple[TrainConfig, list[str]]:
    """``saved`` with the command's value of each runtime setting in ``keys``, and how each is named."""
    values, command_values = saved.model_dump(), cfg.model_dump()
    rows = {row.key: row for row in settings_of(TrainConfig)}
    named = []
    for key in keys:
        *parents, last = key.split(".")
        target = values
        for part in parents:
            target = target[part]
        target[last] = get_dotted(command_values, key)
        named.append(f"{rows[key].flag or key} ({key}) = {target[last]!r}")
    return TrainConfig.model_validate(values), named


def check_packages(cfg: TrainConfig) -> None:
    """Refuse a setting whose optional package is not installed, naming its extra, before any
    environment, model or game work: the trackers of ``log.report_to``, peft for ``train.lora.rank``,
    vLLM for ``--backend vllm``."""
    check_installed(cfg.log.report_to)
    check_peft(cfg.train.lora)
    backend_kind(cfg.backend).check_installed()


def prepare_run(cfg: TrainConfig, resume: bool, given: dict[str, Any] | None = None) -> tuple[TrainConfig, Path, int | None]:
    """The run folder and its settings. On resume, the saved config.yaml is the run's: only
    ``train.steps`` may change (when given); a setting of what the run computes given another value
    is refused, naming each, and one of how it is carried out (``Setting.runtime``) named as ignored."""
    if cfg.out is None:  # a new folder for every run, as rollout's files
        if resume:
            raise ConfigError("--resume continues a run: pass its folder, --out RUN_DIR (a run names it at its start "
                              "and in its last lines).")
        from agentkit.rollout.run import timestamped

        cfg = cfg.model_copy(update={"out": str(timestamped("train"))})
        print(f"run folder: {cfg.out} (--out to choose one)", file=sys.stderr)
    run_dir = Path(cfg.out)
    if resume:
        saved = runs.config_file(run_dir)
        if not saved.exists():
            raise ConfigError(f"--resume: {run_dir} has no config.yaml; nothing to resume.")
        steps, folders = checkpoints(run_dir), step_folders(run_dir)
        if steps:  # the newest folder, marker or not: damaged is refused, never loaded or replaced
            check_complete(runs.checkpoint_dir(run_dir, folders[-1]))
        elif incomplete := sorted(p.name for p in runs.checkpoints_dir(run_dir).glob(f"{runs.STEP_PREFIX}*")):
            # there, but none complete: never replaced silently
            raise ConfigError(f"--resume: {run_dir} has no complete checkpoint: {incomplete} lack their "
                              "COMPLETE marker (damaged, or written by an agentkit without markers). Move them away "
                              "to start the run again from step 0, or choose another --out.")
        original = load_config(saved)
        check_packages(original)  # the run's trackers, peft, vLLM: before anything is loaded or written
        # only the length of the run may change on resume: from the command line when --steps was
        # given (``given`` lists what was); from a config built in Python (``given`` None) always
        given = {"train.steps": cfg.train.steps} if given is None else dict(given)
        conflicts, runtime = _resume_differences(cfg, original, given)
        if conflicts:
            raise ConfigError(f"--resume: {run_dir} was started with other settings than this command gives: "
                              + "; ".join(conflicts) + f". Drop them to continue the run as it was ({saved}), or start "
                              "a new run in another --out. Nothing was changed.")
        if runtime:  # how the run is carried out: this invocation's, never written to config.yaml
            named = _with_runtime(original, cfg, runtime)[1]
            print(f"--resume: {run_dir} continues with its saved settings ({saved}); for this invocation: "
                  + ", ".join(named), file=sys.stderr)
        last = steps[-1] if steps else 0
        wanted = cfg.train.steps if "train.steps" in given else original.train.steps
        if steps and last >= wanted:  # nothing is loaded, trained or written: not even the new length
            print(f"--resume: {run_dir} already has {last} steps (checkpoint {runs.step_name(last)}); nothing to do, nothing "
                  f"changed. Pass --steps N (N > {last}) to train it further.", file=sys.stderr)
            raise NothingToDo(run_dir, last)
        if "train.steps" in given and cfg.train.steps != original.train.steps:
            original = original.model_copy(update={"train": original.train.model_copy(update={"steps": cfg.train.steps})})
            write_atomic(saved, dump_config(original))  # the new length holds for a later --resume too
        cfg = _with_runtime(original, cfg, runtime)[0] if runtime else original
        drop_lost_steps(run_dir, last, keep_trajectories=cfg.async_rl.enabled)
        if not steps:  # stopped before its first checkpoint: the same run again from its initial model
            for name in (runs.METRICS, runs.EVAL):
                truncate_jsonl(run_dir / name, -1)  # the step-0 evaluation too: it runs again
            print(f"--resume: {run_dir} has no complete checkpoint yet; starting it again from step 0 "
                  "with its saved config.", file=sys.stderr)
            return cfg, run_dir, None
        return cfg, run_dir, last
    check_packages(cfg)
    cfg = resolve_defaults(cfg)
    # a mistyped model or teacher folder fails at once, naming it, before anything is written
    from agentkit.models import resolve_model_dir

    if cfg.model:
        resolve_model_dir(cfg.model)
    if cfg.teacher.spec:
        resolve_teacher_spec(cfg.teacher.spec)
    if run_dir.exists() and any(run_dir.iterdir()) and not never_started(run_dir):
        raise ConfigError(f"Run folder {run_dir} already exists and is not empty. Pass --resume to continue it, "
                          "or choose another --out.")
    # bad environment settings fail here, before the run folder is written; evaluation plays at
    # most the tasks the held-out split holds
    episodes = capped_episodes(0, cfg.eval.episodes, check_env_settings(cfg.env, cfg.eval.split, range(cfg.eval.episodes)),
                               what="eval.episodes", split=cfg.eval.split)
    cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"episodes": episodes})})
    from agentkit.train.default_teacher import with_run_defaults

    cfg = with_run_defaults(cfg)  # the teacher and demonstrations the objective needs, built on first use
    if not cfg.train.demos:  # the run's training tasks, made now where they are made on first use
        check_env_settings(cfg.env, "train", run_tasks(cfg.rollout, cfg.train.steps))
    if run_dir.exists() and any(run_dir.iterdir()):
        print(f"{run_dir}: an earlier run there stopped before its first step; starting anew in it.", file=sys.stderr)
        drop_lost_steps(run_dir, 0)
        for name in (runs.EVAL, runs.METRICS):
            (run_dir / name).unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    runs.config_file(run_dir).write_text(dump_config(cfg))
    return cfg, run_dir, None




class NothingToDo(AgentkitError):
    """``--resume`` of a run that already has the steps asked for: ``train`` returns its result as it is."""

    def __init__(self, run_dir: Path, last: int) -> None:
        super().__init__(run_dir, last)  # the arguments again: every rank rebuilds it (``Ranks.on_main``)
        self.run_dir, self.last = Path(run_dir), last

    def __str__(self) -> str:
        return f"{self.run_dir} already has {self.last} steps"
