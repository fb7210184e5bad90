"""``agentkit rollout`` as a library call: validate, build, collect, write, summarize.

``--resume`` completes an interrupted rollout in place. Each episode samples with seeds derived
from (sampling seed, task seed, sample, turn), so playing only the missing episodes gives the file
an uninterrupted run would have written (timings aside). That holds only for the same command,
so the file is checked against it first, reading only: every setting a trajectory records (env,
split, context mode, sampling settings with the seed, model, turns within --max-turns, skills
shown to the policy) must match, and every episode in the file must be one the command plays
(a task seed in seed..seed+episodes-1, a sample below group_size) and appear once. Any
difference is an error that names it and leaves the file untouched. Settings a trajectory does
not record (--env-kwargs, --window, --show-admissible, --system-prompt, the skill bank's contents) cannot be
checked; they are the caller's to repeat.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import shlex
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from agentkit.envs import make
from agentkit.envs.protocol import FiniteTasks, PreparesTasks
from agentkit.envs.registry import lookup
from agentkit.rollout.backend import SamplingParams
from agentkit.rollout.backends import BackendSettings, make_backend
from agentkit.rollout.collector import Collector, EpisodeSpec, RolloutStats, resolve_sampling
from agentkit.rollout.config import RolloutConfig
from agentkit.rollout.runners import make_env_runner
from agentkit.rollout.workers import EnvRunner

from agentkit.core import runs
from agentkit.core.config import MISSING, get_dotted, read_yaml, settings_of
from agentkit.core.errors import AgentkitError, ConfigError, DiskFullError, ModelError, OutputExistsError
from agentkit.core.jsonl import TrajectoryWriter, read_complete_lines
from agentkit.core.model_files import is_model_folder
from agentkit.core.settings import (
    ContextSettings,
    EnvSettings,
    GenerationSettings,
    SamplingSettings,
)

# what a policy trained by `agentkit train` was trained with, and so must be played with
TRAINED_SETTINGS = ("env.id", "env.kwargs", "env.max_turns", "context.mode", "context.window", "context.show_admissible",
                    "context.system_prompt", "sampling.max_new_tokens")


def training_run_of(model: str | os.PathLike | None) -> Path | None:
    """The training run a model path belongs to: the run folder itself, or the run of one of its
    ``checkpoints/step-N`` folders; None for any other model folder."""
    if not model:
        return None
    path = Path(model)
    for candidate in (path, path.parent.parent if path.parent.name == runs.CHECKPOINTS else None):
        if candidate is not None and runs.config_file(candidate).is_file():
            return candidate
    return None


def trained_settings(model: str | os.PathLike | None, keys: set[str], given: dict[str, Any]) -> dict[str, Any]:
    """When ``model`` is (a checkpoint of) a training run, the settings among ``keys`` (dotted) its
    policy was trained with, to play it as it was trained: ``TRAINED_SETTINGS`` (its environment's
    only when ``given`` plays the same environment) and, when the policy saw skills in its prompt,
    its retrieval settings and the run's own skill bank. Empty for any other model. What ``given``
    sets still wins: these are defaults under it (``agentkit rollout`` and ``eval`` use them so)."""
    from agentkit.objectives import capabilities_of

    run = training_run_of(model)
    if run is None:
        return {}
    saved = read_yaml(runs.config_file(run), what="the run's config")
    if not isinstance(saved, dict):
        raise ConfigError(f"{runs.config_file(run)} is not a mapping of settings; is {run} a training run's folder?")
    wanted = list(TRAINED_SETTINGS)
    if given.get("env.id", get_dotted(saved, "env.id")) != get_dotted(saved, "env.id"):
        wanted = [key for key in wanted if not key.startswith("env.")]
    objective = get_dotted(saved, "objective.name")
    if isinstance(objective, str) and capabilities_of(objective).policy_sees_skills and runs.skill_bank_file(run).is_file():
        wanted += ["skills.retrieval", "skills.k", "skills.args"]
    base = {key: value for key in wanted if key in keys and (value := get_dotted(saved, key)) is not MISSING}
    if "skills.k" in base:
        base["skills.bank"] = str(runs.skill_bank_file(run))  # the run's own bank, with its statistics
    return base


def timestamped(name: str, suffix: str = "") -> Path:
    """``runs/NAME-YYYYmmdd-HHMMSS[SUFFIX]``, the default output of a command, with ``-2``, ``-3``...
    after a name another run took in the same second."""
    stem = Path("runs") / f"{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    path, n = stem.with_name(stem.name + suffix), 1
    while path.exists():
        n += 1
        path = stem.with_name(f"{stem.name}-{n}{suffix}")
    return path


def default_out_path() -> Path:
    return timestamped("rollout", ".jsonl")


def check_output(path: Path, *, append: bool, overwrite: bool, resume: bool = False) -> None:
    """Refuse before any work is done: existing file without --append/--overwrite/--resume, a
    missing one with --resume, an unwritable place."""
    if path.is_dir():
        raise ConfigError(f"--out {path} is a directory; give a file name, e.g. {path / 'trajectories.jsonl'}.")
    if path.exists() and not path.is_file():  # /dev/null, a pipe, a socket: no whole-line appends, no fsync
        raise ConfigError(f"--out {path} is not a regular file; give a file name for the trajectories, e.g. "
                          "runs/rollout.jsonl.")
    if resume and not path.exists():
        raise ConfigError(f"--resume: {path} does not exist, so there is no interrupted rollout to complete. "
                          "Check --out, or drop --resume to start a new rollout there.")
    if path.exists() and path.stat().st_size > 0 and not (append or overwrite or resume):
        raise OutputExistsError(f"Output file {path} already exists. Pass --append to add to it or --overwrite to replace it.")
    parent = path.parent if str(path.parent) else Path(".")
    existing = parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"Cannot write {path}: {existing} is not a writable directory.")
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"Cannot write {path}: the file is not writable.")


def resolve_env(env: EnvSettings) -> EnvSettings:
    """``env`` with the environment's own defaults filled in where a setting was left to it (the
    turn limit, its registered settings under those given) and its id as registered
    (``vaults/vaults_v0`` is ``vaults/vaults-v0``), so that a run's config.yaml records what was
    played; an unknown id fails here with "did you mean"."""
    from agentkit.envs import env_info

    info = env_info(env.id)
    return env.model_copy(update={"id": info.id, "max_turns": env.max_turns or info.max_turns,
                                  "kwargs": {**info.kwargs, **env.kwargs}})  # as make() merges them


def held_out_split(env_id: str) -> str:
    """The environment's held-out split (what eval plays by default)."""
    from agentkit.envs import env_info

    return env_info(env_id).eval_split


PREPARE_AHEAD = 4096  # tasks an environment that builds them up front (PreparesTasks) builds before a run


def check_env_settings(env: EnvSettings, split: str, seeds: Iterable[int] = ()) -> int | None:
    """Build one environment of ``split`` and close it, so bad settings fail before anything is
    played or written; return how many tasks the split holds when the environment says
    (``FiniteTasks``), else None. An environment that builds its tasks up front (``PreparesTasks``:
    games generated on first use) builds those of ``seeds`` now, with progress, when it steps in
    this process (with env workers, each worker makes its own games, in parallel)."""
    probe = env_factory(env.id, split=split, max_turns=env.max_turns, env_kwargs=env.kwargs)()
    try:
        base = probe.unwrapped
        available = base.num_tasks if isinstance(base, FiniteTasks) else None
        if env.workers == 0 and isinstance(base, PreparesTasks):  # workers make theirs in parallel
            # the first PREPARE_AHEAD now, with progress; any later ones on first use (a huge --episodes streams)
            ahead = list(itertools.islice((s for s in seeds if available is None or s < available), PREPARE_AHEAD))
            if ahead:
                base.prepare(ahead)
        return available
    finally:
        probe.close()


def capped_episodes(first_seed: int, episodes: int, available: int | None, *, what: str, split: str) -> int:
    """``episodes``, or fewer when the split holds fewer tasks from ``first_seed`` on (a note says so)."""
    if available is None or first_seed + episodes <= available:
        return episodes
    left = max(0, available - first_seed)
    if left == 0:
        raise ConfigError(f"{what}: split {split!r} holds {available} tasks (seeds 0..{available - 1}); "
                          f"--seed {first_seed} is past them. Use a lower --seed.")
    print(f"{what}: split {split!r} holds {available} tasks, so {left} episodes are played instead of {episodes}.",
          file=sys.stderr)
    return left


def make_envs(env: EnvSettings, split: str) -> EnvRunner:
    """The runner of ``split``'s environments as ``env`` says: in this process, worker processes or Ray actors."""
    make_env = env_factory(env.id, split=split, max_turns=env.max_turns, env_kwargs=env.kwargs)
    return make_env_runner(make_env, env.workers, ray=env.ray, step_timeout_s=env.step_timeout,
                           reset_timeout_s=env.reset_timeout)


def sampling_params(sampling: GenerationSettings, seed: int) -> SamplingParams:
    """Sampling settings as the backends take them (``GenerationSettings`` alone: greedy)."""
    extra = sampling.model_dump(exclude={"max_new_tokens"})
    return SamplingParams(max_new_tokens=sampling.max_new_tokens, seed=seed,
                          **({"temperature": 0.0} | extra))


def make_collector(backend, envs, *, env: EnvSettings, split: str, sampling: SamplingParams, context: ContextSettings,
                   skills=None, max_in_flight: int = 0, consecutive_errors: int = 0,
                   policy_version=None) -> Collector:
    """The one way every command builds a collector from settings (``policy_version``: the training
    loop's, see ``Collector``)."""
    return Collector(backend, envs, env_id=env.id, split=split, sampling=sampling, context=context, skills=skills,
                     max_in_flight=max_in_flight, max_consecutive_errors=env.max_errors,
                     consecutive_errors=consecutive_errors, max_observation_chars=env.max_observation_chars,
                     policy_version=policy_version)


def make_backend_from(settings: BackendSettings, model_dir: Path, *, seed: int):
    """The generation backend ``settings`` describe, over ``model_dir``."""
    return make_backend(settings, model_dir, seed=seed)


def env_factory(env_id: str, *, split: str, max_turns: int, env_kwargs: dict) -> functools.partial:
    """A picklable builder of one wrapped environment (worker processes call it)."""
    return functools.partial(make, env_id, max_turns=max_turns, action_parser="format", split=split, **env_kwargs)


@dataclass(frozen=True)
class ResumePlan:
    """What ``--resume`` found in the output file and what is left to play.

    Attributes:
        path: the output file.
        done: trajectories already in the file (its complete lines, each checked against the command).
        remaining: the command's episodes not in the file, in the order an uninterrupted run plays them.
        torn_bytes: size of the torn last line (an interrupted write) that is moved to
            ``FILE.torn`` before appending; 0 when the file ends cleanly.
        models: each model name recorded in the file, with the first line that has it (checked
            against the backend once it is built).
    """

    path: Path
    done: int
    remaining: tuple[EpisodeSpec, ...]
    torn_bytes: int
    models: tuple[tuple[str, int], ...] = ()

    @property
    def torn_path(self) -> Path:
        return self.path.with_name(self.path.name + ".torn")


_FLAGS = {"env": "--env", "split": "--split", "context_mode": "--context", "model": "--model",
          "sampling.temperature": "--temperature", "sampling.top_p": "--top-p", "sampling.top_k": "--top-k",
          "sampling.max_new_tokens": "--max-new-tokens", "sampling.seed": "--seed"}


def _mismatch(out: Path, line: int, name: str, recorded: Any, current: Any) -> ConfigError:
    flag = _FLAGS.get(name)
    return ConfigError(
        f"--resume: {out} was not written by this command: {name}{f' ({flag})' if flag else ''} is {recorded!r} in "
        f"the file (line {line}) but {current!r} in this command. Rerun with the settings of the interrupted "
        "rollout, or write to a new file (--out). The file was not changed.")


def episode_specs(cfg: RolloutConfig) -> Iterator[EpisodeSpec]:
    """Every episode of the command, in the order an uninterrupted run starts them, made as they are
    read (``--episodes 1000000000000`` streams)."""
    return (EpisodeSpec(seed=cfg.seed + task, sample=s) for task in range(cfg.episodes) for s in range(cfg.group_size))


def plan_resume(cfg: RolloutConfig, out: Path) -> ResumePlan:
    """Check the trajectories already in ``out`` against this command and list the episodes still
    to play. Reads only; any difference raises ``ConfigError`` naming it (see the module docstring)."""
    existing, torn = read_complete_lines(out)
    from agentkit.envs import env_info

    # as the collector records it: stop=None means the environment's stop strings
    specs, sampling = list(episode_specs(cfg)), resolve_sampling(sampling_params(cfg.sampling, cfg.seed),
                                                           env_info(cfg.env.id).action_format)
    wanted = {(spec.seed, spec.sample) for spec in specs}
    current = {"env": cfg.env.id, "split": cfg.split, "context_mode": cfg.context.mode,
               **{f"sampling.{key}": value for key, value in sampling.to_dict().items()}}
    seen: dict[tuple[int, int], int] = {}
    models: dict[str, int] = {}
    for line, trajectory in enumerate(existing, start=1):
        recorded = {"env": trajectory.env, "split": trajectory.split, "context_mode": trajectory.context_mode,
                    **{f"sampling.{key}": value for key, value in trajectory.sampling.items()}}
        for name in [*current, *(name for name in recorded if name not in current)]:
            if recorded.get(name, "(not recorded)") != current.get(name, "(no such setting)"):
                raise _mismatch(out, line, name, recorded.get(name, "(not recorded)"),
                                current.get(name, "(no such setting)"))
        if len(trajectory.turns) > cfg.env.max_turns:
            raise ConfigError(f"--resume: {out} line {line} has {len(trajectory.turns)} turns, more than this "
                              f"command's --max-turns {cfg.env.max_turns}. Pass the --max-turns of the interrupted "
                              "rollout, or write to a new file (--out). The file was not changed.")
        if trajectory.skills_in_prompt and not cfg.skills.bank:
            raise ConfigError(f"--resume: {out} line {line} was played with skills in the policy's prompt, but this "
                              "command has no --skills. Pass the --skills (and --retrieval, --skills-k) of the "
                              "interrupted rollout. The file was not changed.")
        key = (trajectory.seed, trajectory.sample)
        if key not in wanted:
            raise ConfigError(
                f"--resume: {out} line {line} is task seed {trajectory.seed}, sample {trajectory.sample}, which this "
                f"command does not play (it plays task seeds {cfg.seed}..{cfg.seed + cfg.episodes - 1}, samples "
                f"0..{cfg.group_size - 1}). Pass the --seed, --episodes and --group-size of the interrupted rollout "
                "(more episodes are fine), or use --append to add other episodes to this file. The file was not changed.")
        if key in seen:
            raise ConfigError(
                f"--resume: {out} holds task seed {trajectory.seed}, sample {trajectory.sample} twice (lines "
                f"{seen[key]} and {line}), so it was not written by one rollout and resuming cannot make it free of "
                "duplicates. Remove the extra line or write to a new file (--out). The file was not changed.")
        seen[key] = line
        models.setdefault(trajectory.model, line)
    remaining = tuple(spec for spec in specs if (spec.seed, spec.sample) not in seen)
    return ResumePlan(path=out, done=len(existing), remaining=remaining, torn_bytes=len(torn),
                      models=tuple(models.items()))


def check_resumed_model(plan: ResumePlan, backend_name: str) -> None:
    """The file's episodes must come from this model: the same name, or paths to the same folder."""
    for recorded, line in plan.models:
        if recorded == backend_name:
            continue
        try:
            if os.path.samefile(recorded, backend_name):
                continue
        except OSError:  # not paths, or no longer there
            pass
        raise _mismatch(plan.path, line, "model", recorded, backend_name)


def run_rollout(cfg: RolloutConfig, model_dir: Path, *, progress=None, out: Path | None = None, skills=None,
                on_resume: Callable[[ResumePlan], None] | None = None) -> tuple[RolloutStats, Path]:
    """Play ``cfg.episodes`` tasks ``cfg.group_size`` times each and write the trajectories.

    ``cfg.env`` must have the environment's defaults filled in (``resolve_env``). ``skills``: the
    ``SkillSelector`` whose skills the policy sees (built by the caller from ``cfg.skills``), or None.
    With ``cfg.resume``, play only the episodes missing from ``out`` and append them;
    ``on_resume`` gets the ``ResumePlan`` once the file has been checked, before anything is played
    (when nothing remains, the model is not loaded and nothing is played).
    """
    out = Path(out or cfg.out or default_out_path())
    check_output(out, append=cfg.append, overwrite=cfg.overwrite, resume=cfg.resume)
    lookup(cfg.env.id)  # unknown id -> did-you-mean, before anything is loaded
    if not is_model_folder(model_dir):
        raise ModelError(f"--model {model_dir}: no model there (no config.json). Build one with: agentkit model init --out {model_dir}")
    if cfg.env.ray is not None:
        from agentkit.rollout.ray_workers import connect

        connect(cfg.env.ray)  # a bad address fails here, before a model is loaded

    sampling, specs = sampling_params(cfg.sampling, cfg.seed), episode_specs(cfg)
    plan = plan_resume(cfg, out) if cfg.resume else None
    if plan is not None:
        if on_resume is not None:
            on_resume(plan)
        if not plan.remaining:
            if plan.torn_bytes:
                TrajectoryWriter(out, mode="append").close()  # sets the torn line aside; the file ends cleanly
            return RolloutStats(), out
        specs = list(plan.remaining)

    # bad env settings fail here, before a model is loaded or the output file touched; first-use games are made now
    check_env_settings(cfg.env, cfg.split, range(cfg.seed, cfg.seed + cfg.episodes) if plan is None else
                       sorted({spec.seed for spec in specs}))
    with contextlib.ExitStack() as resources:  # whatever was built is closed, however this ends
        backend = make_backend_from(cfg.backend, model_dir, seed=cfg.seed)
        resources.callback(backend.close)
        if plan is not None:
            check_resumed_model(plan, backend.name)
        envs = make_envs(cfg.env, cfg.split)
        resources.callback(envs.close)
        collector = make_collector(backend, envs, env=cfg.env, split=cfg.split, sampling=sampling, context=cfg.context,
                                   skills=skills, max_in_flight=cfg.max_in_flight)
        mode = "append" if cfg.append or cfg.resume else "overwrite" if cfg.overwrite else "new"
        try:
            writer = TrajectoryWriter(out, mode=mode)
        except AgentkitError:
            raise
        except OSError as err:
            raise ConfigError(f"Cannot write {out}: {err}") from err
        try:
            with writer:
                stats = collector.run(specs, writer.write, progress=progress)
        except DiskFullError as err:
            raise DiskFullError(f"{err} {_after_disk_full(cfg, out)}") from err
        except Exception:
            if mode == "new" and writer.count == 0:
                out.unlink(missing_ok=True)  # a refused run leaves no file it created (Ctrl-C keeps it: --resume)
            raise
    return stats, out


def resume_command(cfg: RolloutConfig, out: Path) -> str:
    """The command that completes this rollout in ``out``: every setting of ``cfg`` that is not its
    default, as flags (so settings a trajectory does not record are repeated too), and --resume."""
    words = ["agentkit", "rollout"]
    for row in settings_of(RolloutConfig):
        if row.key in ("out", "append", "overwrite", "resume") or row.variant not in (None, cfg.backend.kind):
            continue
        value: Any = cfg
        for part in row.key.split("."):
            value = getattr(value, part)
        if value == row.default or value is None:
            continue
        if isinstance(value, bool):
            words.append(row.flag if value else f"--no-{row.flag[2:]}")
        elif isinstance(value, dict):
            words += [row.flag, json.dumps(value)]
        elif isinstance(value, list | tuple):
            words += [row.flag, *map(str, value)]
        else:
            words += [row.flag, str(value)]
    return shlex.join([*words, "--out", str(out), "--resume"])


def _after_disk_full(cfg: RolloutConfig, out: Path) -> str:
    if cfg.overwrite:
        return "Then run the same command again (--overwrite replaces the old file only once the new one is complete)."
    if cfg.append:
        return ("Then rerun with --append and the seeds still missing (--seed, --episodes): --resume does not apply "
                "to an appended file.")
    return f"Then complete the rollout with: {resume_command(cfg, out)}"


def run_eval(cfg, model_dir: Path, *, out: Path | None = None, progress=None, skills=None,
             played: list | None = None) -> RolloutStats:
    """Greedy episodes on seeds ``cfg.seed .. cfg.seed + cfg.episodes - 1`` of ``cfg.split`` (an
    ``EvalConfig`` with the environment's defaults filled in), or ``cfg.samples`` sampled ones per
    seed; with ``out``, the trajectories are written there (``cfg.append`` / ``cfg.overwrite`` as
    for rollout), and ``played`` collects them."""
    played = played if played is not None else []
    lookup(cfg.env.id)
    # bad env settings fail here, before anything is played or written; a split of N tasks plays at most N
    episodes = capped_episodes(cfg.seed, cfg.episodes, check_env_settings(
        cfg.env, cfg.split, range(cfg.seed, cfg.seed + cfg.episodes)), what="eval", split=cfg.split)
    specs = [EpisodeSpec(seed, k) for seed in range(cfg.seed, cfg.seed + episodes) for k in range(cfg.samples)]
    # several samples of a task are drawn at temperature 1 (pass@k); one is greedy
    sampling = sampling_params(cfg.sampling if cfg.samples == 1 else SamplingSettings(
        max_new_tokens=cfg.sampling.max_new_tokens, temperature=1.0), cfg.seed)
    with contextlib.ExitStack() as resources:  # whatever was built is closed, however this ends
        backend = make_backend_from(cfg.backend, model_dir, seed=cfg.seed)
        resources.callback(backend.close)
        envs = make_envs(cfg.env, cfg.split)
        resources.callback(envs.close)
        collector = make_collector(backend, envs, env=cfg.env, split=cfg.split, sampling=sampling, context=cfg.context,
                                   skills=skills)
        if out is None:
            return collector.run(specs, played.append, progress=progress)
        with TrajectoryWriter(out, mode="append" if cfg.append else "overwrite" if cfg.overwrite else "new") as writer:

            def keep(trajectory) -> None:
                writer.write(trajectory)
                played.append(trajectory)

            return collector.run(specs, keep, progress=progress)
